"""``np.random`` inside ``@hg.jit``: draws traced into the program, fresh at every call.

NumPy's random functions take no traced argument, so without this they ran at trace
time and their numbers were baked into the program: every call returned the same
"random" values. While a thread traces, the legacy ``np.random`` functions listed in
``TRACED`` draw from hologram's counter-based generator (``hologram.ops.random_bits``)
instead, keyed by a seed the jit draws from NumPy's global state before every call (so
``np.random.seed`` repeats a run; the numbers are not NumPy's, only their
distributions) and a stream per call site. Every other drawing function of
``np.random`` raises a clear error in a tracing thread rather than bake its numbers.
Threads that are not tracing call NumPy's own functions (the patch checks a
thread-local), and the patch is installed only while some thread traces.

A ``numpy.random.Generator``'s methods (or a ``RandomState``'s) cannot be intercepted
(a C type's): their numbers would be drawn once, at trace time, and baked in. So a
trace fails with a clear error when a Generator or RandomState the function reads from
a closure cell or a module global changed its state while tracing
(:func:`generators_unchanged`), and ``default_rng()`` without a seed is refused in a
tracing thread (fresh entropy, drawn once). A Generator with a fixed seed created
inside the function gives the same numbers at every call in NumPy too: that one is
traced as the constants it is.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..errors import ShapeError
from ..isa import dtypes
from ..isa.builder import Var, broadcast_shape
from ..ops import random_bits
from .errors import unsupported

#: The seed slot a trace's program reads (identity marks it among the hidden inputs):
#: the jit puts a fresh draw there at every call (:func:`draw_seed`).
SEED_SLOT = np.zeros((), np.int32)

_real: dict[str, Callable[..., Any]] = {}
_installed = 0
_lock = threading.Lock()
_state = threading.local()


def draw_seed() -> np.ndarray:
    """A call's seed, from NumPy's global state (NumPy's own randint, never a patch)."""
    randint = _real.get("randint", np.random.randint)
    return np.array(randint(0, random_bits.SEED_RANGE), dtype=np.int32)


def _size(size: Any, func: str) -> tuple[int, ...]:
    if size is None:
        return ()
    if isinstance(size, (int, np.integer)):
        size = (size,)
    if not isinstance(size, (tuple, list)) or not all(
            isinstance(s, (int, np.integer)) for s in size):
        raise unsupported(f"random.{func}", "size", f"expected an int or a tuple of ints, "
                          f"got {size!r}")
    shape = tuple(int(s) for s in size)
    if any(s < 0 for s in shape):
        raise unsupported(f"random.{func}", "size", f"negative dimensions {list(shape)}")
    return shape


class _Draws:
    """The draws of the trace in progress on this thread: its seed and next stream."""

    def __init__(self, seed: Callable[[], Var]) -> None:
        self.seed_of = seed
        self.stream = 0

    def key(self) -> tuple[Var, int]:
        self.stream += 1
        return self.seed_of(), self.stream - 1


def _draws() -> _Draws | None:
    return getattr(_state, "draws", None)


def _drawer(draw: Callable[..., Var]) -> Callable[[str, tuple[int, ...]], Var]:
    """``draw`` (random_bits.uniform or .normal) in float64 on the next stream of this
    thread's trace; ``func`` names the NumPy function in errors."""
    def fn(func: str, shape: tuple[int, ...]) -> Var:
        d = _draws()
        assert d is not None
        seed, stream = d.key()
        try:
            return draw(seed, shape, dtypes.f64, stream)
        except ValueError as e:
            raise unsupported(f"random.{func}", "size", str(e)) from None
    return fn


_uniform01 = _drawer(random_bits.uniform)
_normal01 = _drawer(random_bits.normal)


def _param(x: Any, func: str, arg: str) -> Var:
    """A location or scale: a number, an array or a traced value, as an f64 Var."""
    from .lift import value  # (lift imports this module)

    return Var(value(x, f"random.{func}", arg, np.dtype(np.float64)))


def _affine(func: str, base: Callable[[str, tuple[int, ...]], Var], a: Any, b: Any,
            size: Any, names: tuple[str, str], scale_of: Callable[[Var, Var], Var]) -> Var:
    """``a + scale_of(a, b) * base``, with NumPy's rule for the result's shape: ``size``
    when given, else the parameters' broadcast shape."""
    pa, pb = _param(a, func, names[0]), _param(b, func, names[1])
    sa, sb = tuple(pa.shape), tuple(pb.shape)
    shape = _size(size, func) if size is not None else broadcast_shape(sa, sb)
    try:
        holds = broadcast_shape(shape, sa, sb) == shape
    except ShapeError:
        holds = False
    if not holds:
        raise unsupported(f"random.{func}", "size", f"{list(shape)} does not hold the "
                          f"parameters' shapes {list(sa)} and {list(sb)}")
    return pa + scale_of(pa, pb) * base(func, shape)


def _random(size: Any = None) -> Var:
    return _uniform01("random", _size(size, "random"))


def _rand(*dims: int) -> Var:
    return _uniform01("rand", _size(dims, "rand"))


def _randn(*dims: int) -> Var:
    return _normal01("randn", _size(dims, "randn"))


def _standard_normal(size: Any = None) -> Var:
    return _normal01("standard_normal", _size(size, "standard_normal"))


def _uniform(low: Any = 0.0, high: Any = 1.0, size: Any = None) -> Var:
    return _affine("uniform", _uniform01, low, high, size, ("low", "high"),
                   lambda lo, hi: hi - lo)


def _normal(loc: Any = 0.0, scale: Any = 1.0, size: Any = None) -> Var:
    return _affine("normal", _normal01, loc, scale, size, ("loc", "scale"),
                   lambda _loc, sc: sc)


#: np.random's legacy functions drawn in the program while a thread traces (each
#: gives a Var; the patch hands it out as a traced value).
TRACED: dict[str, Callable[..., Any]] = {
    "random": _random, "random_sample": _random, "sample": _random, "ranf": _random,
    "rand": _rand, "randn": _randn, "standard_normal": _standard_normal,
    "uniform": _uniform, "normal": _normal,
}
#: The other drawing functions: an error in a tracing thread (their numbers would be
#: drawn once, at trace time, and repeat at every call).
REFUSED = ("beta", "binomial", "bytes", "chisquare", "choice", "dirichlet", "exponential",
           "f", "gamma", "geometric", "gumbel", "hypergeometric", "laplace", "logistic",
           "lognormal", "logseries", "multinomial", "multivariate_normal",
           "negative_binomial", "noncentral_chisquare", "noncentral_f", "pareto",
           "permutation", "poisson", "power", "randint", "random_integers", "rayleigh",
           "shuffle", "standard_cauchy", "standard_exponential", "standard_gamma",
           "standard_t", "triangular", "vonmises", "wald", "weibull", "zipf")


def _unseeded(seed: Any = None, *args: Any, **kwargs: Any) -> bool:
    return seed is None


#: Functions refused in a tracing thread only when the predicate holds of their
#: arguments: ``default_rng()`` draws fresh entropy (NumPy: new numbers at every call),
#: ``default_rng(seed)`` the same numbers every time, which a trace may bake.
REFUSED_WHEN: dict[str, Callable[..., bool]] = {"default_rng": _unseeded}


def _patched(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    traced = TRACED.get(name)
    refuse_when = REFUSED_WHEN.get(name)

    def fn(*args: Any, **kwargs: Any) -> Any:
        if _draws() is None:  # this thread is not tracing: NumPy's own
            return real(*args, **kwargs)
        if refuse_when is not None:
            if refuse_when(*args, **kwargs):
                raise unsupported(f"random.{name}", "seed", "without a seed it draws fresh "
                                  "entropy, which a trace would draw once and repeat at "
                                  "every call; seed it, or use np.random's functions "
                                  "(traced)")
            return real(*args, **kwargs)
        if traced is None:
            raise unsupported(f"random.{name}", "call", "not traced: its numbers would be "
                              "drawn once, at trace time, and repeat at every call (traced: "
                              f"{', '.join(sorted(TRACED))}); draw outside @hg.jit and pass "
                              "the array in")
        from .traced import wrap  # (traced imports this module)

        return wrap(traced(*args, **kwargs))
    fn.__name__ = name
    fn.__doc__ = real.__doc__
    return fn


@contextmanager
def drawing(seed: Callable[[], Var]) -> Iterator[_Draws]:
    """np.random's functions draw into this thread's trace (``seed()``: the trace's
    seed value, an input made on first use) while the block runs."""
    global _installed
    with _lock:
        if _installed == 0:
            for name in (*TRACED, *REFUSED, *REFUSED_WHEN):
                real = getattr(np.random, name, None)
                if real is not None:
                    _real[name] = real
                    setattr(np.random, name, _patched(name, real))
        _installed += 1
    outer = _draws()
    _state.draws = d = _Draws(seed)
    try:
        yield d
    finally:
        _state.draws = outer
        with _lock:
            _installed -= 1
            if _installed == 0:
                for name, real in _real.items():
                    setattr(np.random, name, real)


_STATEFUL = (np.random.Generator, np.random.RandomState)


def _generators(fn: Callable[..., Any]) -> list[tuple[str, Any]]:
    """(name, object): the Generators and RandomStates ``fn`` reads from its closure
    cells and module globals."""
    from .guards import _names  # (guards imports lift, which imports this module)

    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    found = []
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or (),
                          strict=False):
        try:
            v = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(v, _STATEFUL):
            found.append((name, v))
    g = getattr(fn, "__globals__", {})
    found += [(n, g[n]) for n in sorted(_names(code)) if isinstance(g.get(n), _STATEFUL)]
    return found


def _state_of(obj: Any) -> bytes:
    st = obj.bit_generator.state if isinstance(obj, np.random.Generator) \
        else obj.get_state(legacy=False)
    return pickle.dumps(st)


@contextmanager
def generators_unchanged(fn: Callable[..., Any]) -> Iterator[None]:
    """Raise if a Generator or RandomState ``fn`` reads drew while the block traced it."""
    before = [(name, g, _state_of(g)) for name, g in _generators(fn)]
    yield
    for name, g, state in before:
        if _state_of(g) != state:
            raise unsupported(f"random.{type(g).__name__}", name,
                              "drew while tracing: its numbers would be baked into the "
                              "program and repeat at every call; use np.random's functions "
                              "(traced, fresh per call) or draw outside @hg.jit and pass "
                              "the array in")


__all__ = ["REFUSED", "REFUSED_WHEN", "SEED_SLOT", "TRACED", "draw_seed", "drawing",
           "generators_unchanged"]
