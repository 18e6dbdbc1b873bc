"""hologram's exception hierarchy.

Every error a user can trigger derives from :class:`HologramError` and also from
the built-in exception a NumPy user would expect (``ValueError`` for bad values,
``TypeError`` for wrong types, ``MemoryError`` for exhausted pools), so existing
``except ValueError`` code keeps working.
"""

from __future__ import annotations


class HologramError(Exception):
    """Base class of all hologram errors."""


class BackendUnavailableError(HologramError, RuntimeError):
    """A requested backend cannot run here; the message says why."""


class VerifyError(HologramError, ValueError):
    """An Atlas ISA program is malformed (shape, dtype, operand or axis error)."""


class ParseError(VerifyError):
    """The text form of a program could not be parsed."""


class ShapeError(HologramError, ValueError):
    """Operands have sizes or shapes that do not fit the operation."""


class DTypeError(HologramError, TypeError):
    """An operand has a dtype the operation does not accept."""


class AliasError(HologramError, ValueError):
    """An output overlaps an input in a way the operation cannot allow."""


class BufferStateError(HologramError, ValueError):
    """A buffer was used after free, or with an executor that does not own it."""


class ArgumentTypeError(HologramError, TypeError):
    """An argument has the wrong Python type (a list where a Buffer goes, a str size)."""


class ArgumentValueError(HologramError, ValueError):
    """An argument has a value the call does not accept (an unknown mode name, a
    negative limit, min greater than max)."""


class DLPackError(HologramError, BufferError):
    """A buffer cannot be exported through DLPack as asked (the protocol's BufferError)."""


class OutOfMemoryError(HologramError, MemoryError):
    """A memory pool reached its configured limit."""


class NumpyUnsupportedError(HologramError, NotImplementedError):
    """``@hg.jit`` cannot trace a NumPy call, argument or keyword; the message names the
    NumPy function and the argument, and says what to write instead where there is a way."""


class TracedIndexError(NumpyUnsupportedError, IndexError):
    """An index outside an axis, found while ``@hg.jit`` traces (NumPy's IndexError)."""


class HandleError(HologramError, KeyError):
    """The handle API was given an unknown or already released handle."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0]) if self.args else ""


__all__ = [
    "AliasError",
    "ArgumentTypeError",
    "ArgumentValueError",
    "BackendUnavailableError",
    "BufferStateError",
    "DLPackError",
    "DTypeError",
    "HandleError",
    "HologramError",
    "NumpyUnsupportedError",
    "OutOfMemoryError",
    "ParseError",
    "ShapeError",
    "TracedIndexError",
    "VerifyError",
]
