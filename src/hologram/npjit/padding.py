"""``np.pad`` on traced values: each axis padded in turn, as NumPy pads it.

The pad widths are known at trace time, so where each padded element comes from is
too: for the modes that copy the array's own elements (``edge``, ``reflect``,
``symmetric``, ``wrap``), NumPy's ``np.pad`` of the axis's positions ``arange(n)``
*is* the source position of every padded element, computed by NumPy itself and so
exactly NumPy's rule (widths beyond the axis's length included, where NumPy reflects
or wraps again). That map is cut into runs of consecutive, reversed or repeated
positions, each a slice (reversed: a take of affine positions; repeated: one position
broadcast), joined by one CONCAT per axis: no gather with an index table, and the
scheduler fuses the parts into whatever reads them. ``constant`` (and ``empty``,
whose undefined padding is zeros here) joins constant blocks instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..isa import builder as B
from ..isa.builder import Var
from ..isa.value import Value
from .dtypes import to_numpy
from .errors import unsupported
from .shapes import take_positions

#: Keyword arguments each traced mode takes (NumPy refuses others for it too).
MODE_KWARGS: dict[str, frozenset[str]] = {
    "constant": frozenset({"constant_values"}), "empty": frozenset(),
    "edge": frozenset(), "wrap": frozenset(),
    "reflect": frozenset({"reflect_type"}), "symmetric": frozenset({"reflect_type"}),
}


def _pairs(x: Any, ndim: int, arg: str, integral: bool) -> np.ndarray:
    """``x`` as NumPy's ``(ndim, 2)`` (before, after) pairs: a scalar, one pair for
    every axis, or one pair per axis."""
    if isinstance(x, Var) or isinstance(x, Value):
        raise unsupported("pad", arg, "must be known at trace time (numbers, not a "
                                      "traced array)")
    a = np.asarray(x)
    if integral and a.size and a.dtype.kind not in "iu":
        raise unsupported("pad", arg, f"must be integers, got {a.dtype}")
    try:
        pairs = np.broadcast_to(a, (ndim, 2))
    except ValueError:
        raise unsupported("pad", arg, f"shape {list(a.shape)} does not give a (before, "
                                      f"after) pair for each of {ndim} axes") from None
    if integral and (pairs < 0).any():
        raise unsupported("pad", arg, "widths must be >= 0")
    return pairs


def _runs(idx: np.ndarray) -> list[tuple[int, int, int]]:
    """``idx`` as (start, step, count) runs, step in (1, -1, 0)."""
    out: list[tuple[int, int, int]] = []
    i, n = 0, len(idx)
    while i < n:
        step = int(idx[i + 1] - idx[i]) if i + 1 < n else 1
        step = step if step in (1, -1, 0) else 1
        j = i + 1
        while j < n and idx[j] - idx[j - 1] == step:
            j += 1
        out.append((int(idx[i]), step, j - i))
        i = j
    return out


def _with(shape: tuple[int, ...], axis: int, n: int) -> tuple[int, ...]:
    return tuple(n if d == axis else s for d, s in enumerate(shape))


def _copied(x: Value, axis: int, idx: np.ndarray) -> list[Value]:
    parts = []
    for start, step, count in _runs(idx):
        if step == 0 and count > 1:  # one position, repeated (edge)
            one = take_positions(x, axis, start, 1, 1)
            parts.append(B.expand(one, _with(x.shape, axis, count)))
        else:
            parts.append(take_positions(x, axis, start, step or 1, count))
    return parts


def pad(x: Value, pad_width: Any, mode: Any = "constant",
        kwargs: dict[str, Any] | None = None) -> Value:
    kwargs = dict(kwargs or {})
    if not isinstance(mode, str):
        raise unsupported("pad", "mode", "a callable mode is a Python callback per "
                                         "vector, which is not traced")
    if mode not in MODE_KWARGS:
        raise unsupported("pad", "mode", f"mode {mode!r} is not traced (traced: "
                                         f"{', '.join(MODE_KWARGS)})")
    extra = set(kwargs) - MODE_KWARGS[mode]
    if extra:
        raise unsupported("pad", "kwargs", f"mode {mode!r} takes no {sorted(extra)}")
    if kwargs.get("reflect_type", "even") != "even":
        raise unsupported("pad", "reflect_type", "only 'even' is traced")
    widths = _pairs(pad_width, x.ndim, "pad_width", True)
    values = None
    if mode in ("constant", "empty"):
        cv = kwargs.get("constant_values", 0) if mode == "constant" else 0
        values = _pairs(cv, x.ndim, "constant_values", False).astype(to_numpy(x.dtype))
    for axis, (before, after) in enumerate(widths.tolist()):
        if before == after == 0:
            continue
        if values is not None:
            parts = [B.const(values[axis][0].item(), x.dtype, _with(x.shape, axis, before)),
                     x,
                     B.const(values[axis][1].item(), x.dtype, _with(x.shape, axis, after))]
        else:
            n = x.shape[axis]
            if n == 0:
                raise unsupported("pad", "array", f"can't extend empty axis {axis} using "
                                                  f"modes other than 'constant' or 'empty'")
            idx = np.pad(np.arange(n), (before, after), mode=mode)
            parts = _copied(x, axis, idx)
        parts = [p for p in parts if p.shape[axis]]
        x = parts[0] if len(parts) == 1 else B.concat(parts, axis)
    return x


__all__ = ["pad"]
