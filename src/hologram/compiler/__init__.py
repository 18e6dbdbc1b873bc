"""The compiler: canonicalize -> schedule -> render -> compile."""

from .canonicalize import ReductionStats, canonicalize
from .rewrite import Pat, RewriteLoopError, Rule, rewrite

__all__ = ["Pat", "ReductionStats", "RewriteLoopError", "Rule", "canonicalize", "rewrite"]
