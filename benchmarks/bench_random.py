"""Random numbers in programs: NumPy's np.random under @hg.jit, and dropout under
torch.compile, beside the peers a user would pick instead.

    .venv/bin/python benchmarks/bench_random.py [--json out.json] [--quick]

Two tables, rows sampled interleaved in one process, ratios against the first row:

* A Monte-Carlo estimate of pi from N uniform pairs, written once in NumPy: NumPy
  itself (legacy ``np.random`` and a ``default_rng`` Generator), ``@hg.jit`` on the
  same function (the draws fused into the reduction, hologram's generator), Numba
  (``@njit(parallel=True)``, a loop calling ``np.random.random()``), JAX (the same
  arithmetic on ``jax.random.uniform`` with a key split per call, jitted). The "pi err"
  column is each row's estimate minus pi (a few 1e-4 at N = 8M for any sound draw).
* Dropout as a transformer applies it, ``h + dropout(x, 0.1)`` over BERT-base's hidden
  state at batch 8 (8 x 128 x 768, f32), forward, then forward and backward: eager
  PyTorch, Inductor and hologram through ``torch.compile``. "keep" is the fraction of
  the dropout's mask kept (0.9 expected).

Numbers differ between rows by design (each draws its own); only their distributions
agree. Numba and JAX are the ``bench`` extra; a missing one is an ERROR row.
"""

from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import numpy as np  # noqa: E402
from common import Candidate, Report, add_interleaved, once, target  # noqa: E402

N = 8_000_000
SETTLE_S = 0.1


def pi_numpy(scale):
    u = np.random.random(N)
    v = np.random.random(N)
    return scale * np.mean(u * u + v * v < 1.0)


def pi_table(rep: Report, repeat: int, hg) -> None:
    t = rep.table(f"Monte-Carlo pi, {N // 1_000_000}M uniform pairs (f64)", baseline="numpy",
                  unit="ms", vs={"x hg": "hologram jit"}, extra_cols=("pi err", "first call"))
    rows: dict[str, Candidate] = {}
    errors: dict[str, str] = {}
    four = np.array(4.0)

    def add(row: str, call, note: str) -> None:
        try:
            first, r = once(call)
            rows[row] = Candidate(call, note, {"pi err": f"{float(r) - math.pi:+.1e}",
                                               "first call": f"{first:.2f} s"})
        except Exception as e:  # noqa: BLE001 - a failure is a result too
            errors[row] = f"{type(e).__name__}: {str(e)[:200]}"

    add("numpy", lambda: pi_numpy(four), "legacy np.random")
    rng = np.random.default_rng(0)

    def pi_generator():
        u = rng.random(N)
        v = rng.random(N)
        return 4.0 * np.mean(u * u + v * v < 1.0)
    add("numpy Generator", pi_generator, "default_rng().random")
    hj = hg.jit(pi_numpy)
    add("hologram jit", lambda: hj(four), "the NumPy function unchanged")
    try:
        import numba

        @numba.njit(parallel=True, fastmath=False)
        def pi_numba(n):
            acc = 0
            for _ in numba.prange(n):
                x = np.random.random()
                y = np.random.random()
                acc += x * x + y * y < 1.0
            return 4.0 * acc / n
        add("numba", lambda: pi_numba(N), "@njit(parallel=True) loop")
    except ImportError as e:
        errors["numba"] = f"not installed ({e.name}); pip install 'hologram[bench]'"
    try:
        import jax

        jax.config.update("jax_platforms", "cpu")
        import jax.numpy as jnp

        @jax.jit
        def pi_jax(key):
            ku, kv = jax.random.split(key)
            u = jax.random.uniform(ku, (N,), dtype=jnp.float32)
            v = jax.random.uniform(kv, (N,), dtype=jnp.float32)
            return 4.0 * jnp.mean(u * u + v * v < 1.0)
        keys = [jax.random.PRNGKey(0)]

        def call_jax():
            keys[0], k = jax.random.split(keys[0])
            return jax.block_until_ready(pi_jax(k))
        add("jax.jit", call_jax, "jax.random.uniform, f32 (x64 off), a key split per call")
    except ImportError as e:
        errors["jax.jit"] = f"not installed ({e.name}); pip install 'hologram[bench]'"
    add_interleaved(t, rows, repeat=repeat, settle_s=SETTLE_S, failed=errors)
    for peer in ("numpy", "numpy Generator", "numba", "jax.jit"):
        r = t.ratio_to(peer, "hologram jit")
        if r is not None:
            rep.check(target(f"pi vs {peer}", f"ahead of {peer}", r, lambda v: v > 1,
                             lambda v: f"{v:.2f}x faster" if v >= 1 else f"{1 / v:.2f}x slower"),
                      t, "hologram jit")


def dropout_tables(rep: Report, repeat: int) -> None:
    import torch

    import hologram_torch  # noqa: F401  (registers backend="hologram")

    torch.manual_seed(0)
    h = torch.randn(8, 128, 768)
    x0 = torch.randn(8, 128, 768)

    def fwd(h, x):
        return h + torch.nn.functional.dropout(x, 0.1, True)

    for backward in (False, True):
        title = ("residual dropout h + dropout(x, 0.1), 8x128x768 f32, "
                 + ("forward and backward" if backward else "forward"))
        t = rep.table(title, baseline="eager", unit="ms", extra_cols=("keep",))
        rows: dict[str, Candidate] = {}
        errors: dict[str, str] = {}
        for name, backend in (("eager", None), ("inductor", "inductor"),
                              ("hologram", "hologram")):
            f = fwd if backend is None else torch.compile(fwd, backend=backend, dynamic=False)
            x = x0.clone().requires_grad_(backward)

            def call(f=f, x=x, backward=backward):
                if not backward:
                    with torch.no_grad():
                        return f(h, x)
                out = f(h, x)
                x.grad = None
                out.sum().backward()
                return out

            try:
                _, out = once(call)
                keep = float(((out - h) != 0).float().mean())
                rows[name] = Candidate(call, "", {"keep": f"{keep:.4f}"})
            except Exception as e:  # noqa: BLE001
                errors[name] = f"{type(e).__name__}: {str(e)[:200]}"
        add_interleaved(t, rows, repeat=repeat, settle_s=SETTLE_S, failed=errors)
        for peer in ("eager", "inductor"):
            r = t.ratio_to(peer, "hologram")
            if r is not None:
                rep.check(target(f"dropout {'fwd+bwd' if backward else 'fwd'} vs {peer}",
                                 f"ahead of {peer}", r, lambda v: v > 1,
                                 lambda v: f"{v:.2f}x faster" if v >= 1
                                 else f"{1 / v:.2f}x slower"), t, "hologram")
        torch._dynamo.reset()


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--no-torch", action="store_true", help="only the NumPy table")
    args = p.parse_args()
    common.fresh_inductor_cache()
    hg = common.quiet_hologram()
    if not os.environ.get("HOLOGRAM_THREADING"):
        hg.set_threading("team")  # a NumPy user's process (bench_numpy.py says why)
    rep = Report("random", "random numbers in programs: np.random under @hg.jit, dropout "
                           "under torch.compile")
    repeat = 5 if args.quick else 15
    pi_table(rep, repeat, hg)
    if not args.no_torch:
        if not os.environ.get("HOLOGRAM_THREADING"):
            hg.set_threading(None)  # beside PyTorch: the default for a torch process
        dropout_tables(rep, repeat)
    rep.finish(args)


if __name__ == "__main__":
    main()
