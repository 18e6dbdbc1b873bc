"""Counter-based random numbers, written as a program of 32-bit integer instructions.

Why no instruction of its own: a counter-based generator is a hash of (key, element
position), and the ISA's u32 arithmetic already wraps modulo 2**32 alike in the C,
CUDA C and WGSL renderers and in NumPy (the reference interpreter), so the generator
below gives the same bits on every backend without a line of new rendering, and
fusion puts it inside the kernel that uses it: a dropout reads its input and writes
its output and mask, nothing else (PyTorch's CPU dropout writes the noise tensor and
reads it back).

The hash is Chris Wellons' ``lowbias32`` (two xor-shift-multiply rounds, found by his
hash prospector; bias 0.107), applied twice with two keys derived from the seed and a
stream number::

    k1 = mix(seed ^ stream * 0x9e3779b9)       k2 = mix(k1 + 0x9e3779b9)
    h  = mix(position + k1)                     word = mix(h ^ k2)

Two calls' seeds give windows of ``mix`` over overlapping counters only through the
first round; the second round's key differs with the seed, so their words do not
repeat each other. Words for a second number per element (f64's low bits, the
Box-Muller angle) use ``k3 = mix(k2 + 0x9e3779b9)`` on the same ``h``.

These are not PyTorch's (or NumPy's) random streams: a program draws numbers of the
same distribution, not the same numbers. A seed is a program input (a fresh one per
call, drawn by whoever runs the program), so one compiled program serves every call.
"""

from __future__ import annotations

import math

from ..isa import dtypes
from ..isa.builder import Var, const, iota
from ..isa.dtypes import DType

GOLDEN = 0x9E3779B9  # 2**32 / golden ratio: spreads consecutive stream numbers apart
MIX_MUL = (0x21F0AAAD, 0x735A2D97)
MIX_SHIFT = (16, 15, 15)
#: The significand bits a uniform number of each float dtype is made of: the top bits
#: of a word, times 2**-bits, so every value is exact and below 1.0 (a wider value
#: rounded to the dtype could round up to 1.0). f64 takes 53 bits from two words.
UNIFORM_BITS: dict[str, int] = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53}
#: The most elements one draw may number (positions are u32 counters).
MAX_ELEMENTS = 1 << 32
#: Seeds are drawn below this: an int32's non-negative range, so a seed is an i32
#: input on every backend (WGSL has no 64-bit integers).
SEED_RANGE = (1 << 31) - 1


def mix(x: Var) -> Var:
    """lowbias32: a bijection of u32 whose every output bit depends on every input bit."""
    a, b, c = MIX_SHIFT
    x = x ^ (x >> a)
    x = x * MIX_MUL[0]
    x = x ^ (x >> b)
    x = x * MIX_MUL[1]
    return x ^ (x >> c)


def check_size(shape: tuple[int, ...]) -> None:
    """ValueError unless one draw can number every element of ``shape`` (u32 counters)."""
    n = math.prod(shape)
    if n > MAX_ELEMENTS:
        raise ValueError(f"shape: {list(shape)} has {n} elements; random numbers are drawn "
                         f"for at most 2**32 at once")


def positions(shape: tuple[int, ...]) -> Var:
    """Each element's row-major position in ``shape``, as u32 (IOTAs times strides, so
    kernels compute it from their loop indices and read nothing)."""
    check_size(shape)
    terms: list[Var] = []
    stride = 1
    for d in reversed(range(len(shape))):
        if shape[d] > 1:
            t = Var(iota(shape, d, dtypes.u32))
            terms.append(t * stride if stride > 1 else t)
        stride *= shape[d]
    if not terms:
        return Var(const(0, dtypes.u32, shape))
    pos = terms[0]
    for t in terms[1:]:
        pos = pos + t
    return pos


def keys(seed: Var, stream: int) -> tuple[Var, Var, Var]:
    """(k1, k2, k3): 0-d u32 keys of one stream under ``seed`` (any integer dtype, 0-d)."""
    if seed.ndim != 0 or seed.dtype.kind != "i":
        raise ValueError(f"seed: expected a 0-d integer value, got {seed.dtype}"
                         f"{list(seed.shape)}")
    s = seed.cast(dtypes.u32) if seed.dtype is not dtypes.u32 else seed
    k1 = mix(s ^ ((stream * GOLDEN) & 0xFFFFFFFF))
    k2 = mix(k1 + GOLDEN)
    k3 = mix(k2 + GOLDEN)
    return k1, k2, k3


def words(seed: Var, shape: tuple[int, ...], stream: int, count: int = 1) -> list[Var]:
    """``count`` (1 or 2) independent u32 words per element of ``shape``."""
    k1, k2, k3 = keys(seed, stream)
    h = mix(positions(shape) + k1)
    return [mix(h ^ k) for k in (k2, k3)[:count]]


def _unit(word: Var, bits: int, dtype: DType) -> Var:
    """The top ``bits`` of ``word`` as a number in [0, 1) of ``dtype`` (exact)."""
    return (word >> (32 - bits)).cast(dtype) * (2.0 ** -bits)


def uniform_from(ws: list[Var], dtype: DType) -> Var:
    """Uniform numbers in [0, 1) of float ``dtype`` from one word per element (two for
    f64: 27 high bits and 26 low bits)."""
    if dtype is dtypes.f64:
        hi = (ws[0] >> 5).cast(dtype)
        lo = (ws[1] >> 6).cast(dtype)
        return (hi * float(1 << 26) + lo) * (2.0 ** -53)
    return _unit(ws[0], UNIFORM_BITS[dtype.name], dtype)


def uniform(seed: Var, shape: tuple[int, ...], dtype: DType, stream: int = 0) -> Var:
    """Numbers uniform in [0, 1), each of ``dtype``'s resolution (UNIFORM_BITS)."""
    _check_float(dtype)
    return uniform_from(words(seed, shape, stream, 2 if dtype is dtypes.f64 else 1), dtype)


def normal(seed: Var, shape: tuple[int, ...], dtype: DType, stream: int = 0) -> Var:
    """Standard normal numbers (Box-Muller: ``sqrt(-2 log u) cos(2 pi v)``, ``u`` in
    (0, 1] so the log is finite). Half floats are computed in f32 and rounded."""
    _check_float(dtype)
    work = dtypes.f64 if dtype is dtypes.f64 else dtypes.f32
    if work is dtypes.f64:
        a = uniform(seed, shape, work, stream)
        b = uniform(seed, shape, work, stream + (1 << 31))
    else:
        w1, w2 = words(seed, shape, stream, 2)
        a, b = _unit(w1, 24, work), _unit(w2, 24, work)
    z = ((1.0 - a).log() * -2.0).sqrt() * (b * (2.0 * math.pi)).cos()
    return z.cast(dtype) if dtype is not work else z


def _check_float(dtype: DType) -> None:
    if dtype.name not in UNIFORM_BITS:
        raise ValueError(f"dtype: random numbers are drawn in a float dtype "
                         f"({', '.join(UNIFORM_BITS)}), got {dtype}")
