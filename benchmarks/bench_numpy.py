"""NumPy workloads under @hg.jit beside NumPy, numexpr, Numba, JAX and torch.compile.

    .venv/bin/python benchmarks/bench_numpy.py [--json out.json] [--quick] [--dtype float16]

Five functions written once in plain NumPy: a k-means assignment step, log-sum-exp
over rows, a 2-D five-point stencil, Black-Scholes call/put pricing and a
cosine-similarity matrix. ``@hg.jit`` runs the NumPy code unchanged; JAX runs the
same code with ``jnp``; Numba runs explicit ``prange`` loops (``@njit(parallel=True)``);
torch.compile runs the same computation written in torch; numexpr evaluates the
element-wise part (NumPy does the matmuls and reductions it cannot). Each table's rows
are sampled interleaved; ratios are against NumPy, and the ``x hg`` column is each
row's time over hologram's (>1: hologram is faster). First-call times (trace and
compile) are in the notes column. hologram runs on its own thread team, as in a process
without PyTorch (``HOLOGRAM_THREADING`` overrides). The extras (numexpr, numba,
jax[cpu]) are the pyproject ``bench`` extra; a missing one is an ERROR row, not a crash.
``--dtype float16`` runs the same functions on float16 arrays (NumPy computes each
float16 ufunc in float32 and rounds it, element by element; a peer without float16 is
an ERROR row).
"""

from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import numpy as np  # noqa: E402
from common import Candidate, Report, add_interleaved, max_abs_err, once, target  # noqa: E402

# --------------------------------------------------------------------------- the workloads
# Each takes its arrays and uses only NumPy: @hg.jit traces the very same function.


def kmeans_assign(x, c):
    d = (x * x).sum(axis=1, keepdims=True) - 2.0 * (x @ c.T) + (c * c).sum(axis=1)
    return np.argmin(d, axis=1)


def logsumexp_rows(x):
    m = x.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]


def stencil(u):
    return 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:]) - u[1:-1, 1:-1]


A1, A2, A3, A4, A5 = 0.31938153, -0.356563782, 1.781477937, -1.821255978, 1.330274429
RSQRT2PI = 0.39894228040143267794
RATE, VOL = 0.02, 0.30


def _cnd(d):
    k = 1.0 / (1.0 + 0.2316419 * np.abs(d))
    ret = RSQRT2PI * np.exp(-0.5 * d * d) * (k * (A1 + k * (A2 + k * (A3 + k * (A4 + k * A5)))))
    return np.where(d > 0, 1.0 - ret, ret)


def black_scholes(s, k, t):
    sqrt_t = np.sqrt(t)
    d1 = (np.log(s / k) + (RATE + 0.5 * VOL * VOL) * t) / (VOL * sqrt_t)
    d2 = d1 - VOL * sqrt_t
    e = np.exp(-RATE * t)
    call = s * _cnd(d1) - k * e * _cnd(d2)
    put = k * e * (1.0 - _cnd(d2)) - s * (1.0 - _cnd(d1))
    return call, put


def cosine_sim(x):
    n = x / np.linalg.norm(x, axis=1, keepdims=True)
    return n @ n.T


# --------------------------------------------------------------------------- torch twins
def torch_versions():
    import torch

    def km(x, c):
        d = (x * x).sum(1, keepdim=True) - 2.0 * (x @ c.T) + (c * c).sum(1)
        return torch.argmin(d, 1)

    def lse(x):
        m = x.amax(1, keepdim=True)
        return (m + torch.log(torch.exp(x - m).sum(1, keepdim=True)))[:, 0]

    def cnd(d):
        k = 1.0 / (1.0 + 0.2316419 * d.abs())
        ret = RSQRT2PI * torch.exp(-0.5 * d * d) * (k * (A1 + k * (A2 + k * (A3 + k * (
            A4 + k * A5)))))
        return torch.where(d > 0, 1.0 - ret, ret)

    def bs(s, k, t):
        sqrt_t = torch.sqrt(t)
        d1 = (torch.log(s / k) + (RATE + 0.5 * VOL * VOL) * t) / (VOL * sqrt_t)
        d2 = d1 - VOL * sqrt_t
        e = torch.exp(-RATE * t)
        return s * cnd(d1) - k * e * cnd(d2), k * e * (1.0 - cnd(d2)) - s * (1.0 - cnd(d1))

    def cos(x):
        n = x / torch.linalg.vector_norm(x, dim=1, keepdim=True)
        return n @ n.T

    return {"kmeans": km, "logsumexp": lse, "stencil": stencil, "black_scholes": bs,
            "cosine": cos}


# --------------------------------------------------------------------------- numba twins
def numba_versions():
    from numba import njit, prange

    @njit(parallel=True, fastmath=False)
    def km(x, c):
        n, d = x.shape
        k = c.shape[0]
        out = np.empty(n, np.int64)
        cc = np.empty(k, x.dtype)
        for j in range(k):
            cc[j] = (c[j] * c[j]).sum()
        for i in prange(n):
            best, arg = np.inf, 0
            for j in range(k):
                dot = 0.0
                for t in range(d):
                    dot += x[i, t] * c[j, t]
                v = cc[j] - 2.0 * dot
                if v < best:
                    best, arg = v, j
            out[i] = arg
        return out

    @njit(parallel=True)
    def lse(x):
        n, m = x.shape
        out = np.empty(n, x.dtype)
        for i in prange(n):
            mx = x[i, 0]
            for j in range(1, m):
                mx = max(mx, x[i, j])
            s = 0.0
            for j in range(m):
                s += np.exp(x[i, j] - mx)
            out[i] = mx + np.log(s)
        return out

    @njit(parallel=True)
    def st(u):
        n, m = u.shape
        out = np.empty((n - 2, m - 2), u.dtype)
        for i in prange(1, n - 1):
            for j in range(1, m - 1):
                out[i - 1, j - 1] = 0.25 * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1]
                                            + u[i, j + 1]) - u[i, j]
        return out

    @njit
    def cnd(d):
        k = 1.0 / (1.0 + 0.2316419 * abs(d))
        ret = RSQRT2PI * math.exp(-0.5 * d * d) * (k * (A1 + k * (A2 + k * (A3 + k * (
            A4 + k * A5)))))
        return 1.0 - ret if d > 0 else ret

    @njit(parallel=True)
    def bs(s, k, t):
        n = s.shape[0]
        call, put = np.empty(n, s.dtype), np.empty(n, s.dtype)
        for i in prange(n):
            sqrt_t = math.sqrt(t[i])
            d1 = (math.log(s[i] / k[i]) + (RATE + 0.5 * VOL * VOL) * t[i]) / (VOL * sqrt_t)
            d2 = d1 - VOL * sqrt_t
            e = math.exp(-RATE * t[i])
            c1, c2 = cnd(d1), cnd(d2)
            call[i] = s[i] * c1 - k[i] * e * c2
            put[i] = k[i] * e * (1.0 - c2) - s[i] * (1.0 - c1)
        return call, put

    @njit(parallel=True)
    def cos(x):
        n, d = x.shape
        xn = np.empty_like(x)
        for i in prange(n):
            s = 0.0
            for t in range(d):
                s += x[i, t] * x[i, t]
            r = 1.0 / math.sqrt(s)
            for t in range(d):
                xn[i, t] = x[i, t] * r
        return xn @ xn.T

    return {"kmeans": km, "logsumexp": lse, "stencil": st, "black_scholes": bs, "cosine": cos}


# --------------------------------------------------------------------------- numexpr twins
def numexpr_versions():
    import numexpr as ne

    def lse(x):
        m = x.max(axis=1, keepdims=True)
        return m[:, 0] + np.log(ne.evaluate("exp(x - m)").sum(axis=1))

    def st(u):
        env = {"a": u[:-2, 1:-1], "b": u[2:, 1:-1], "c": u[1:-1, :-2], "d": u[1:-1, 2:],
               "e": u[1:-1, 1:-1], "q": np.float32(0.25)}
        return ne.evaluate("q * (a + b + c + d) - e", local_dict=env)

    def bs(s, k, t):
        f = np.float32
        env = {"s": s, "k": k, "t": t, "r": f(RATE), "v": f(VOL), "h": f(0.5), "one": f(1.0),
               "p": f(0.2316419), "g": f(RSQRT2PI), "a1": f(A1), "a2": f(A2), "a3": f(A3),
               "a4": f(A4), "a5": f(A5)}
        d1 = ne.evaluate("(log(s / k) + (r + h * v * v) * t) / (v * sqrt(t))", env)
        d2 = ne.evaluate("d1 - v * sqrt(t)", env | {"d1": d1})
        cnd = ("where({d} > 0, one - g * exp(-h * {d} * {d}) * ({k} * (a1 + {k} * (a2 + {k} "
               "* (a3 + {k} * (a4 + {k} * a5))))), g * exp(-h * {d} * {d}) * ({k} * (a1 + "
               "{k} * (a2 + {k} * (a3 + {k} * (a4 + {k} * a5))))))")
        kk = "(one / (one + p * abs({d})))"
        c1 = ne.evaluate(cnd.format(d="d1", k=kk.format(d="d1")), env | {"d1": d1})
        c2 = ne.evaluate(cnd.format(d="d2", k=kk.format(d="d2")), env | {"d2": d2})
        e2 = env | {"c1": c1, "c2": c2}
        return (ne.evaluate("s * c1 - k * exp(-r * t) * c2", e2),
                ne.evaluate("k * exp(-r * t) * (one - c2) - s * (one - c1)", e2))

    def cos(x):
        n = ne.evaluate("x / nrm", {"x": x, "nrm": np.sqrt(ne.evaluate("x * x").sum(
            axis=1, keepdims=True))})
        return n @ n.T

    return {"logsumexp": lse, "stencil": st, "black_scholes": bs, "cosine": cos}


# --------------------------------------------------------------------------- driver
WORKLOADS = {
    "kmeans": (kmeans_assign, "k-means assignment, 64 centroids"),
    "logsumexp": (logsumexp_rows, "log-sum-exp over rows"),
    "stencil": (stencil, "2-D five-point stencil"),
    "black_scholes": (black_scholes, "Black-Scholes call and put"),
    "cosine": (cosine_sim, "cosine-similarity matrix"),
}


#: Pause before each sample (then one untimed call), so each implementation is timed as
#: it runs in a loop of its own, not beside the previous row's spinning threads.
SETTLE_S = 0.12


def inputs(name: str, scale: float, dtype: str = "float32") -> tuple[np.ndarray, ...]:
    """The workload's arrays, drawn in float32 and cast to ``dtype``."""
    return tuple(x.astype(dtype) for x in _inputs_f32(name, scale))


def _inputs_f32(name: str, scale: float) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    f = np.float32

    def n(k: int) -> int:
        return max(8, int(k * scale))

    if name == "kmeans":
        return (rng.standard_normal((n(200_000), 16), dtype=f),
                rng.standard_normal((64, 16), dtype=f))
    if name == "logsumexp":
        return (rng.standard_normal((n(4096), 1024), dtype=f) * 4,)
    if name == "stencil":
        return (rng.standard_normal((n(2048), 2048), dtype=f),)
    if name == "black_scholes":
        m = n(2_000_000)
        return (rng.uniform(5, 30, m).astype(f), rng.uniform(1, 100, m).astype(f),
                rng.uniform(0.25, 10, m).astype(f))
    return (rng.standard_normal((n(1024), 256), dtype=f),)


def _leaves(r):
    return r if isinstance(r, tuple) else (r,)


def _err(got, ref) -> str:
    g, e = _leaves(got), _leaves(ref)
    return f"{max(max_abs_err(np.asarray(a), b) for a, b in zip(g, e, strict=True)):.1e}"


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated workloads")
    p.add_argument("--scale", type=float, default=1.0, help="scale the problem sizes")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16"),
                   help="the arrays' dtype (default float32)")
    args = p.parse_args()
    common.fresh_inductor_cache()
    hg = common.quiet_hologram()
    if not os.environ.get("HOLOGRAM_THREADING"):
        # A NumPy user's process has no PyTorch, so @hg.jit runs on hologram's own thread
        # team there; this process imports torch only for the torch.compile row, which
        # would move hologram onto OpenMP's threads (hologram.threads). Measure the
        # NumPy user's setup (docs/perf.md, session 12: under load the OpenMP regions
        # made the stencil 1.5-2.5x slower).
        hg.set_threading("team")
    rep = Report("numpy", "NumPy workloads: @hg.jit vs NumPy, numexpr, Numba, JAX, "
                          "torch.compile")
    repeat = 5 if args.quick else 11
    makers = {}
    failed_import: dict[str, str] = {}
    for peer, fn in (("numexpr", numexpr_versions), ("numba", numba_versions),
                     ("torch.compile", torch_versions)):
        try:
            makers[peer] = fn()
        except ImportError as e:
            failed_import[peer] = f"not installed ({e.name}); pip install 'hologram[bench]'"
    try:
        import jax

        jax.config.update("jax_platforms", "cpu")
        import jax.numpy as jnp
    except ImportError:
        jax = None
        failed_import["jax.jit"] = "not installed; pip install 'hologram[bench]'"
    names = [n for n in WORKLOADS if not args.only or n in args.only.split(",")]
    for name in names:
        _workload(rep, name, args.scale, repeat, hg, makers, failed_import, jax,
                  jnp if jax is not None else None, args.dtype)
    rep.finish(args)


def _workload(rep, name, scale, repeat, hg, makers, failed_import, jax, jnp,
              dtype: str = "float32") -> None:
    """Time one workload's implementations, interleaved, into a table of ``rep``."""
    fn, title = WORKLOADS[name]
    xs = inputs(name, scale, dtype)
    ref = tuple(np.asarray(r, np.float64) for r in _leaves(fn(*(x.astype(np.float64)
                                                                for x in xs))))
    shapes = ", ".join("x".join(map(str, x.shape)) for x in xs)
    t = rep.table(f"{title}: {np.dtype(dtype).name} {shapes}", baseline="numpy", unit="ms",
                  vs={"x hg": "hologram jit"},
                  extra_cols=("max err", "first call"))
    rows: dict[str, Candidate] = {}
    errors = dict(failed_import)
    rows["numpy"] = Candidate(lambda fn=fn, xs=xs: fn(*xs), "",
                              {"max err": _err(fn(*xs), ref)})

    def add(row: str, call, note: str = "") -> None:
        try:
            first, r = once(call)
            rows[row] = Candidate(call, note, {"max err": _err(r, ref),
                                               "first call": f"{first:.2f} s"})
            rep.data[f"{name}:{row}:first_call_s"] = first
        except Exception as e:  # noqa: BLE001 - a failure is a result too
            errors[row] = f"{type(e).__name__}: {str(e)[:200]}"

    hj = hg.jit(fn)
    add("hologram jit", lambda: hj(*xs), "the NumPy function unchanged")
    if "numexpr" in makers:
        if name in makers["numexpr"]:
            nf = makers["numexpr"][name]
            add("numexpr", lambda nf=nf: nf(*xs), "element-wise part; NumPy for the rest")
        else:
            errors["numexpr"] = "n/a: numexpr has no argmin or matmul"
    if "numba" in makers:
        nb = makers["numba"][name]
        add("numba", lambda nb=nb: nb(*xs), "@njit(parallel=True) loops")
    if jax is not None:
        jf = jax.jit(_jax_twin(fn, jnp))
        jxs = [jnp.asarray(x) for x in xs]
        add("jax.jit", lambda jf=jf, jxs=jxs: jax.block_until_ready(jf(*jxs)),
            "the same code on jnp")
    if "torch.compile" in makers:
        import torch

        tf = torch.compile(makers["torch.compile"][name])
        txs = [torch.from_numpy(x) for x in xs]
        add("torch.compile", lambda tf=tf, txs=txs: _np(tf(*txs)), "Inductor")
    # settle: NumPy's OpenBLAS, Numba's and PyTorch's pools spin ~0.1 s after a call; the
    # next row's sample must not share the cores with them (docs/perf.md, session 15)
    add_interleaved(t, rows, repeat=repeat, settle_s=SETTLE_S, failed=errors)
    for peer in ("numpy", "numexpr", "numba", "jax.jit", "torch.compile"):
        r = t.ratio_to(peer, "hologram jit")
        if r is not None:
            rep.check(target(f"{name} vs {peer}", f"ahead of {peer}", r, lambda v: v > 1,
                             lambda v: f"{v:.2f}x faster" if v >= 1
                             else f"{1 / v:.2f}x slower"), t, "hologram jit")


def _np(r):
    return tuple(x.numpy() for x in r) if isinstance(r, tuple) else r.numpy()


def _jax_twin(fn, jnp):
    """``fn`` with its module's ``np`` swapped for ``jax.numpy`` (the same source)."""
    import types

    g = dict(fn.__globals__)
    g["np"] = jnp
    for helper in ("_cnd",):
        if helper in g:
            g[helper] = types.FunctionType(g[helper].__code__, g)
    return types.FunctionType(fn.__code__, g, fn.__name__)


if __name__ == "__main__":
    main()
