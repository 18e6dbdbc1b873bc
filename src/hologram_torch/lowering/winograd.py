"""3x3 stride-1 convolutions by Winograd's minimal filtering, F(m x m, 3 x 3).

Why: an im2col convolution is a GEMM of ``O x 9C x L`` multiply-adds, and on
ResNet-18 at batch 8 hologram's GEMMs already ran at ~165 GFLOP/s per core (near this
machine's single-core peak), so no layout of the column matrix could bring the call
below the GEMM's own time, which is about what Inductor's whole call costs
(docs/perf.md, "Session 13, CNN inference"). Winograd's F(m, 3) computes each ``m x
m`` output tile from an ``(m+2) x (m+2)`` input tile with ``(m+2)^2`` products per
input and output channel pair instead of ``9 m^2``: 2.25x fewer at m = 2, 4x at m = 4.
The products are ``(m+2)^2`` independent GEMMs ``U[t] (O x C) @ V[t] (C x tiles)``,
one batched GEMM; the transforms around it are element-wise over views.

Built, like every convolution here, from existing instructions (views, CONCAT,
element-wise arithmetic, the library GEMM), so its meaning is the same on every
backend and in the reference interpreter:

1. Weight: ``U = G g G^T`` per (output, input) channel, stored ``[O, t, C]`` (one
   CONCAT whose units are output channels: each reads its own 9C weights from cache).
2. Input, in two passes so every read is a view with few terms: rows, ``R_i = sum_p
   BT[i, p] x[m*ty + p]`` (windows of the unpadded input, padded with zeros:
   ``convolution.window_taps``), stored ``[C, a, B, th, W]``; then columns, ``V_ij =
   sum_q BT[j, q] R_i[m*tx + q]``, stored ``[C, t, B*th*tw]``.
3. ``M[t] = U[t] @ V[t]``: one GEMM batched over the ``t = a^2`` tile positions, each
   ``[O, C] x [C, B*th*tw]`` (the batch folded into the columns, as
   ``convolution._batch_folded`` does).
4. Output: ``Y_ij = sum_pq AT[i, p] AT[j, q] M[p*a + q]``, stored ``[O, m*m, B*th*tw]``
   (units are output channels: each reads its ``t`` rows of M from cache), viewed back
   as ``[B, O, H, W]`` (tiles that overhang the output are cropped).

Training runs both gradients the same way (``convolution.INPUT_GRAD_WINOGRAD``,
``WEIGHT_GRAD_WINOGRAD``): the input gradient of a padding-1 convolution is the
convolution of the output gradient with the flipped, transposed weight, so
``conv3x3`` itself; the weight gradient (:func:`weight_grad3x3`) is the adjoint of the
steps above, its GEMM ``dM @ V^T`` summing over the tiles. Measured on ResNet-18's
training step at batch 8, 112 x 112 (``benchmarks/ab_lowering.py --train``, in one
process): 0.948-0.958 of the time with col2im for the input gradients, then 0.921-0.961
with the weight gradients too (docs/perf.md, session 21).

Numerics: the transforms add and subtract values of one tile, so a non-finite input
element reaches every output of its tile(s): an ``inf`` gives ``inf - inf = NaN``
where the direct sum gives ``inf``, and a NaN spreads to tile neighbours whose windows
do not contain it (oneDNN's and cuDNN's Winograd kernels behave the same). Finite
results differ from the direct sum by rounding only (relative ~1e-6 at float32 for m
= 4). Hence Winograd runs only on float32 (float64 asks for exactness and stays
direct) and only where ``HOLOGRAM_CONV`` is not ``direct`` (README, limitations).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from fractions import Fraction as Fr

from hologram.isa.builder import Var, concat, const

from .context import inline

#: (BT, G, AT) of F(m x m, 3 x 3) by output tile size m, from the interpolation points
#: 0, 1, -1 (m = 2) and 0, 1, -1, 2, -2 (m = 4) with the point at infinity (Lavin and
#: Gray, "Fast Algorithms for Convolutional Neural Networks", 2016).
Matrix = list[list[Fr | int]]
TRANSFORMS: dict[int, tuple[Matrix, Matrix, Matrix]] = {
    2: ([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [Fr(1, 2), Fr(1, 2), Fr(1, 2)], [Fr(1, 2), Fr(-1, 2), Fr(1, 2)],
         [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: ([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
         [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[Fr(1, 4), 0, 0], [Fr(-1, 6), Fr(-1, 6), Fr(-1, 6)], [Fr(-1, 6), Fr(1, 6), Fr(-1, 6)],
         [Fr(1, 24), Fr(1, 12), Fr(1, 6)], [Fr(1, 24), Fr(-1, 12), Fr(1, 6)], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}

#: Output positions per image from which a convolution takes the Winograd path. At 7x7
#: (ResNet-18's last stage) the tiles overhang the output: with the transformed weight
#: (16 x O x C, 16 MB there) recomputed per call the whole model ran 5% slower in session
#: 13 (docs/perf.md "Session 13, CNN inference"); with the products' NN layout on
#: OpenBLAS since session 22 it ran faster even so: ResNet-18 at batch 8 0.977, 0.975 and
#: 0.959x the time (sessions 22 and 23; the stage's 3x3 convolutions 11.3 -> ~9.5 ms
#: each, 2.2 ms of it the weight's transform, which inference graphs keep since session
#: 24), its training step level (0.993), a cold first call 0.4-0.5 s longer.
MIN_POSITIONS = 49
#: Images per call from which a convolution takes the Winograd path. With the weight
#: transformed on every call, batch 1 gained 4% (31.0 -> 29.8 ms on one thread, session
#: 13) for ~2 s of a cold first call, so it started at 2; with the transform kept in
#: inference graphs (session 24) ResNet-18 b1 ran 0.709x the time (in-process A/B), its
#: cold first call 3.2-3.4 -> 5.2-5.3 s (0.19 -> 0.30 of Inductor's; docs/perf.md).
MIN_BATCH = 1
#: dtypes Winograd runs on (see the module's docstring: float64 stays direct).
DTYPES = ("f32",)


def enabled() -> bool:
    """``HOLOGRAM_CONV=direct`` keeps every convolution on the direct (im2col) path."""
    return os.environ.get("HOLOGRAM_CONV", "").strip().lower() != "direct"


def tile_size(outs: tuple[int, ...]) -> int:
    """m for an output of ``outs`` positions: 4 where 4x4 tiles cover it exactly, else 2
    (measured on ResNet-18: m = 4 also at 14x14, whose tiles overhang to 16x16, ran 6%
    slower, m = 2 everywhere 8%)."""
    return 4 if all(o % 4 == 0 for o in outs) else 2


def _tiling(outs: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(m, a = m + 2, tile rows, tile columns) of an output of ``outs`` positions."""
    m = tile_size(outs)
    return m, m + 2, -(-outs[0] // m), -(-outs[1] // m)


def applies(x: Var, weight: Var | tuple[int, ...], stride: tuple[int, ...],
            dilation: tuple[int, ...], groups: int, outs: tuple[int, ...]) -> bool:
    """Whether ``conv_nd`` takes this path: a dense 2-D 3x3 stride-1 convolution at
    float32 with at least MIN_POSITIONS output positions per image and MIN_BATCH
    images. ``weight``: the weight or its shape."""
    wshape = tuple(weight if isinstance(weight, tuple) else weight.shape)
    return (enabled() and x.dtype.name in DTYPES and x.ndim == 4 and groups == 1
            and wshape[2:] == (3, 3) and stride == (1, 1)
            and dilation == (1, 1) and outs[0] * outs[1] >= MIN_POSITIONS
            and x.shape[0] >= MIN_BATCH
            and x.shape[0] * x.shape[1] * wshape[0] > 0)


def _combine(terms: list[tuple[Fr | int, Var]]) -> Var:
    """``sum c * v`` over the terms with ``c != 0`` (a coefficient of 1 or -1 is an add
    or a subtraction, no product)."""
    out: Var | None = None
    for c, v in terms:
        if c == 0:
            continue
        if out is None:
            out = v if c == 1 else (-v if c == -1 else v * float(c))
        elif c == 1:
            out = out + v
        elif c == -1:
            out = out - v
        else:
            out = out + v * float(c)
    assert out is not None, "a transform row of zeros"
    return out


def _along(values: list[Fr], axis: int, ndim: int, like: Var) -> Var | None:
    """``values`` as a constant vector along ``axis`` of an ``ndim``-D shape (size 1
    elsewhere; a CONCAT of constants, computed where it is read), or None if all are 0.
    A transform's row as a vector lets one CONCAT part hold a whole row of tile
    positions: 6 parts where 36 (one per position) made ResNet-18's C source 6x
    longer and its cold first call 2.7x slower (docs/perf.md, "Session 13")."""
    if not any(values):
        return None
    one = (1,) * ndim
    return Var(concat([const(float(v), like.dtype, one) for v in values], axis))


def _sum(terms: list[Var]) -> Var:
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out


def stack(parts: list[Var], axis: int) -> Var:
    """``parts`` (same shape) stacked along a new ``axis``: one CONCAT of unit-dim
    reshapes, which the scheduler stores (one loop nest per part)."""
    shp = parts[0].shape
    return Var(concat([p.reshape((*shp[:axis], 1, *shp[axis:])).v for p in parts], axis))


def weight_transform(weight: Var, m: int) -> Var:
    """``U [O, t, C]`` of ``weight [O, C, 3, 3]`` for F(m x m, 3 x 3): ``U[o, i, j, c] =
    sum_pq G[i, p] G[j, q] w[o, c, p, q]``, one part per i (the j axis a vector of
    coefficients). A function of the weight alone: an inference graph computes it
    apart and keeps it while the weight is unchanged (``Ctx.derive``)."""
    o, c = weight.shape[:2]
    a = m + 2
    g = TRANSFORMS[m][1]
    taps_w = [[weight.slice((0, 0, p, q), (o, c, 1, 1)).reshape((o, 1, c)) for q in range(3)]
              for p in range(3)]
    u_parts = []
    for i in range(a):
        terms = [(taps_w[p][q], _along([g[i][p] * g[j][q] for j in range(a)], 1, 3, weight))
                 for p in range(3) for q in range(3)]
        u_parts.append(_sum([t * vec for t, vec in terms if vec is not None]))
    return stack(u_parts, 1).reshape((o, a * a, c))


def conv3x3(x: Var, weight: Var, padding: tuple[int, ...], outs: tuple[int, ...],
            derive: Callable[[Var, str, Callable[[Var], Var]], Var] = inline) -> Var:
    """``F.conv2d(x, weight, None, 1, padding)`` for ``x [B, C, H, W]``, ``weight [O, C,
    3, 3]``: ``[B, O, *outs]``, by F(m x m, 3 x 3) (see the module's docstring).
    ``derive``: ``Ctx.derive``, through which the weight's transform is computed."""
    b = x.shape[0]
    o = weight.shape[0]
    m, a, th, tw = _tiling(outs)
    at = TRANSFORMS[m][2]
    n = b * th * tw

    # 1. the weight, [O, t, C], read as [t, O, C] (a view)
    u = derive(weight, f"winograd{m}", lambda w: weight_transform(w, m))
    u = u.permute((1, 0, 2))

    # 2. the input
    v = _input_tiles(x, padding, outs)

    # 3. one GEMM batched over the tile positions
    mm = u @ v  # [t, O, N]

    # 4. the output: Y[o, i, j, n] = sum_pq AT[i, p] AT[j, q] M[p*a + q, o, n], one part per
    #    i (the j axis a vector of coefficients), each a row of N tiles per channel
    planes = [mm.slice((t, 0, 0), (1, o, n)).reshape((o, 1, n)) for t in range(a * a)]
    y_parts = []
    for i in range(m):
        terms = [(planes[p * a + q], _along([at[i][p] * at[j][q] for j in range(m)], 1, 3, x))
                 for p in range(a) for q in range(a)]
        y_parts.append(_sum([t * vec for t, vec in terms if vec is not None]))
    y = stack(y_parts, 1)  # [O, m, m, N]
    y = y.reshape((o, m, m, b, th, tw)).permute((3, 0, 4, 1, 5, 2))
    y = y.reshape((b, o, th * m, tw * m))
    if (th * m, tw * m) != tuple(outs):
        y = y.slice((0, 0, 0, 0), (b, o, *outs))
    return y


def _input_tiles(x: Var, padding: tuple[int, ...], outs: tuple[int, ...]) -> Var:
    """``V``: the input's tiles transformed, ``[t, C, N]`` (``t = a^2`` tile positions,
    ``N`` tiles over the batch), as both the convolution and its weight gradient read
    them."""
    from .convolution import window_taps
    from .movement import pad_with

    b, c, h, w = x.shape
    m, a, th, tw = _tiling(outs)
    bt = TRANSFORMS[m][0]
    n = b * th * tw
    zero = const(0, x.dtype, ())
    # columns then rows (the strided reads fall in the smaller pass; the rows pass then
    # reads whole tile rows contiguously). Views of [C, B, H, W]: the batch is folded
    # into the GEMM's columns
    # Each column transform is zero-padded along the rows to hp rows, inside its part of
    # the stored CONCAT (plain stores of zeros around the transform), so every row
    # window below is a view with no padding of its own (a padded window read by many
    # parts would be stored by the scheduler, a pass per window).
    hp = th * m + a - 1
    xt = x.permute((1, 0, 2, 3)).reshape((c, b * h, w))
    wins = window_taps(xt, (a,), (m,), (padding[1],), (1,), (tw,))  # each [C, B*H, tw]
    vpad = [0, 0, padding[0], hp - h - padding[0]]
    s = stack([pad_with(_combine([(bt[j][q], wins[q]) for q in range(a)]).reshape(
        (c, b, h, tw)), vpad, zero) for j in range(a)], 1)  # [C, a, B, hp, tw]
    s = s.reshape((c * a, b, hp, tw))
    rows = window_taps(s, (a, 1), (m, 1), (0, 0), (1, 1), (th, tw))
    rows = [t.reshape((c, a, b * th, tw)) for t in rows]  # each [C, a, B*th, tw]

    # one part per i, each over every j (the rows carry the j axis along)
    v = stack([_combine([(bt[i][p], rows[p]) for p in range(a)]) for i in range(a)], 1)
    return v.reshape((c, a * a, n)).permute((1, 0, 2))  # [C, a, a, ...] as [t, C, N]: a view


def weight_grad3x3(grad: Var, x: Var, padding: tuple[int, ...]) -> Var:
    """The weight gradient ``[O, C, 3, 3]`` of ``conv3x3(x, w, padding)`` for the output
    gradient ``grad [B, O, *outs]``, by the same F(m x m, 3 x 3): the adjoints of its
    steps in reverse. The output transform's adjoint turns each ``m x m`` tile of the
    gradient into ``dM [t, O, N]``; ``dU = dM @ V^T`` is one GEMM batched over the tile
    positions whose inner dimension is the tiles (the sum over images and positions);
    the weight transform's adjoint gives ``dw = G^T dU G``. ``(m+2)^2 / m^2`` products
    per output position and channel pair (2.25 at m = 4) where the column matrix's GEMM
    has 9, and no column matrix nine times the input's size."""
    b, o = grad.shape[:2]
    outs = tuple(grad.shape[2:])
    c = x.shape[1]
    m, a, th, tw = _tiling(outs)
    _, g, at = TRANSFORMS[m]
    n = b * th * tw

    # the output transform's adjoint, dM[p, q] = sum_i AT[i, p] sum_j AT[j, q] dY[i, j],
    # in two passes over views of the gradient as the input's transform is: columns
    # (a part per q, windows of m along each row), then rows (a part per p), so the
    # tiles (batch, tile row, tile column) end innermost with the columns contiguous.
    # Positions past the output (overhanging tiles) have a zero gradient.
    from .convolution import window_taps
    from .movement import pad_with

    hp, wp = th * m, tw * m
    d = grad
    if (hp, wp) != outs:
        d = pad_with(d, [0, wp - outs[1], 0, hp - outs[0]], const(0, grad.dtype, ()))
    wins = window_taps(d.permute((1, 0, 2, 3)).reshape((o, b * hp, wp)), (m,), (m,), (0,),
                       (1,), (tw,))  # each [O, B*hp, tw]
    r = stack([_combine([(at[j][q], wins[j]) for j in range(m)]).reshape((o, b, hp, tw))
                for q in range(a)], 1).reshape((o * a, b, hp, tw))  # [O, a(q), B, hp, tw]
    rows = [t.reshape((o, a, b * th, tw))
            for t in window_taps(r, (m, 1), (m, 1), (0, 0), (1, 1), (th, tw))]
    dm = stack([_combine([(at[i][p], rows[i]) for i in range(m)]) for p in range(a)], 1)
    dm = dm.reshape((o, a * a, n)).permute((1, 0, 2))  # [O, a, a, N] as [t, O, N]: a view

    # one GEMM batched over the tile positions, the tiles its inner dimension
    v = _input_tiles(x, padding, outs)  # [t, C, N]
    du = dm @ v.permute((0, 2, 1))  # [t, O, C]

    # the weight transform's adjoint: dw[p, q] = sum_i G[i, p] sum_j G[j, q] dU[i*a + j]
    planes = [du.slice((t, 0, 0), (1, o, c)).reshape((o, c)) for t in range(a * a)]
    half = [[_combine([(g[j][q], planes[i * a + j]) for j in range(a)]) for q in range(3)]
            for i in range(a)]
    # stacked a row at a time: one stack of nine made a select chain that NVRTC (CUDA
    # 13) crashed on inside a thread-strided loop
    rows_w = [stack([_combine([(g[i][p], half[i][q]) for i in range(a)]) for q in range(3)],
                     2) for p in range(3)]  # each [O, C, 3]
    return stack(rows_w, 2)  # [O, C, 3, 3]
