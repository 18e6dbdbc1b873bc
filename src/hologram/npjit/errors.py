"""The one error a NumPy call that cannot be traced gets: it names the NumPy function
and the argument at trace time, never an AttributeError from hologram's insides."""

from __future__ import annotations

from ..errors import NumpyUnsupportedError


def unsupported(func: str, arg: str, why: str) -> NumpyUnsupportedError:
    """``np.<func>``'s ``arg``: why it cannot be traced (and what to write instead)."""
    return NumpyUnsupportedError(f"@hg.jit: np.{func}: {arg}: {why}")


__all__ = ["NumpyUnsupportedError", "unsupported"]
