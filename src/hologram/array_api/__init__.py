"""``hg.numpy``: the Array API standard's namespace (2023.12) over hologram.

Code written to the standard (``xp = x.__array_namespace__()`` or ``import
hologram.numpy as xp``) runs in two places:

- inside ``@hg.jit``, on traced values: each function is NumPy's own (or a body of
  ``np.*`` calls, ``overrides``), and NumPy's protocols hand traced operands to the
  tracer, so the calls fuse into the jit's one program like plain NumPy does;
- outside, on NumPy arrays: the same bodies run eagerly in NumPy.

Where NumPy differs from the standard (``correction=``, ``descending=``,
``include_initial=``, ``copy=``/``device=``, ``clip``'s dtype, ...) the namespace
follows the standard; the tests check it against ``array-api-strict``. Type
promotion is NumPy 2's, which the standard's table is a part of (mixed integer and
float arrays, which the standard leaves undefined and ``array-api-strict`` refuses,
promote as NumPy does). Functions whose result's shape depends on the data
(``nonzero``, ``unique_*``) work outside a trace and are refused inside with
hologram's clear error, as ``np.nonzero`` is.
"""

from __future__ import annotations

import types

import numpy as np

from . import standard
from .overrides import LINALG_OVERRIDES, OVERRIDES

__array_api_version__ = "2023.12"


def _build() -> dict[str, object]:
    ns: dict[str, object] = {}
    for name in standard.FUNCTIONS:
        ns[name] = OVERRIDES.get(name) or getattr(np, name)
    for name in standard.DTYPES:
        ns[name] = getattr(np, "bool_" if name == "bool" else name)
    for name in standard.CONSTANTS:
        ns[name] = getattr(np, name)
    linalg = types.ModuleType(f"{__name__}.linalg", "The standard's linalg extension: "
                              "NumPy's, with vector_norm, matrix_transpose and vecdot "
                              "from hg.numpy.")
    for name in standard.LINALG_EXTENSION:
        fn = LINALG_OVERRIDES.get(name) or getattr(np.linalg, name)
        setattr(linalg, name, fn)
    ns["linalg"] = linalg
    ns["fft"] = np.fft  # the fft extension: NumPy's, eager only (FFTs are not traced)
    return ns


globals().update(_build())

__all__ = [*standard.FUNCTIONS, *standard.DTYPES, *standard.CONSTANTS, "linalg", "fft",
           "__array_api_version__"]
