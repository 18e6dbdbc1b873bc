"""The Atlas ISA: dtypes, opcodes, hash-consed values, programs, text form, verifier."""

from . import builder, dtypes, opcodes
from .builder import Var
from .dtypes import DType
from .opcodes import Group, Op
from .program import Program
from .value import Value
from .verify import verify

__all__ = ["DType", "Group", "Op", "Program", "Value", "Var", "builder", "dtypes", "opcodes",
           "verify"]
