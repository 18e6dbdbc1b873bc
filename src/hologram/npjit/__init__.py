"""NumPy inside ``@hg.jit``: traced values that speak NumPy's protocols.

``traced.Traced`` is the stand-in a jitted function receives. Plain ``np.*`` calls
reach hologram through ``__array_ufunc__`` (``ufuncs``) and ``__array_function__``
(``functions``); indexing is ``indexing``; captured NumPy arrays and scalars become
hidden inputs and constants (``lift``). Each module builds Atlas ISA values with
``isa.builder``; nothing here compiles or runs.
"""

from .traced import Traced, trace

__all__ = ["Traced", "trace"]
