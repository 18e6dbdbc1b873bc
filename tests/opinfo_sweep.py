"""The OpInfo sweep: PyTorch's own operator samples compiled with ``backend="hologram"``.

PyTorch describes every operator it tests in ``op_db``
(``torch.testing._internal.common_methods_invocations``): the dtypes it supports and a
generator of sample inputs that exercise its corners (broadcasting, scalars, empty and
non-contiguous tensors, keyword arguments). That is a far wider net than tests written
by hand, so this module runs those samples through the backend and compares each with
eager PyTorch, forward and backward. For every sample it records:

* the *status*: ``match``; ``mismatch`` (values differ beyond tolerance); ``error`` (the
  compiled call raised where eager did not); ``crash`` (the worker process died or
  timed out: a segfault must be a failed sample, never a dead run); ``skip`` (eager
  itself refused the sample, or its values are not comparable);
* the *route*: ``hologram`` (at least one hologram program ran and PyTorch computed
  nothing, inside a graph or between graphs), ``partly``, ``torch`` (no program ran) or
  ``none`` (nothing computed at all: views and metadata); see :func:`_route` and
  :class:`EagerWatch`;
* for a mismatch or an error, whether ``backend="aot_eager"`` fails the same way (then
  the difference lies in PyTorch's tracing, not in hologram).

Samples run in worker subprocesses (:class:`Pool`): a worker that dies or runs past the
timeout is replaced and its sample reported as a crash with the signal. Tests
(``tests/test_opinfo.py``) run a fixed subset; ``tools/opinfo_sweep.py`` runs every op
and writes ``docs/opinfo.md``. Run as a script with ``--worker`` this file is a worker
(one JSON request per line on stdin, one JSON result per line on the protocol pipe).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

STATUSES = ("match", "mismatch", "error", "crash", "skip")
ROUTES = ("hologram", "partly", "torch", "none")

#: Ops whose outputs are not comparable value by value, and why: only their
#: shapes and dtypes are compared.
METADATA_ONLY: dict[str, str] = {
    name: "uninitialized memory"
    for name in ("empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
                 "empty_permuted", "resize_", "resize_as_")
}

#: Ops whose result orders equal elements as the implementation likes (``stable=False``
#: is their default): where the sample's input has ties, the indices of tied elements,
#: and which of them receives which gradient, are unspecified. Eager's order is not
#: stable; hologram's sort is. Such a sample that differs from eager is skipped, with
#: this reason. (bf16 samples have ties: 891 distinct values among sort's 8000.)
TIES_UNSPECIFIED = frozenset({"sort", "argsort", "msort", "topk"})
TIES = "ties in the input: the order of equal elements is unspecified without stable=True"

#: torch.testing.assert_close's defaults for float32, used where OpInfo gives none.
DEFAULT_TOL = (1e-5, 1.3e-6)  # atol, rtol
#: The dtypes a sweep runs in (``--dtype``), and assert_close's defaults for each:
#: float32 is the sweep of record (docs/opinfo.md); the 16-bit floats check that
#: half-precision graphs (``hologram_torch.fx_info.HALF``) round as eager does.
DTYPE_TOL: dict[str, tuple[float, float]] = {
    "float32": DEFAULT_TOL, "bfloat16": (1e-5, 1.6e-2), "float16": (1e-5, 1e-3)}


@dataclass
class SampleResult:
    """One sample of one op: what happened and where it ran."""

    op: str
    index: int
    status: str
    route: str | None = None
    phase: str = ""  # where a mismatch or error showed: "forward" or "backward"
    detail: str = ""
    aot_eager_fails: bool | None = None  # for mismatch/error: does aot_eager fail too?
    fallbacks: list[str] = field(default_factory=list)  # "op: why" run in PyTorch
    programs: int = 0
    backward: bool = False  # whether a backward was compared
    by_f64: bool = False  # matched by the float64 rule (see F64_MULTIPLIER), not eager's
    seconds: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, line: str) -> SampleResult:
        return cls(**json.loads(line))


# --------------------------------------------------------------------------------------
# Which ops and samples.
# --------------------------------------------------------------------------------------
def op_key(op: Any) -> str:
    """An OpInfo's unique name: ``name`` or ``name.variant_test_name``."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def opinfos(dtype: str = "float32") -> dict[str, Any]:
    """Every OpInfo that supports ``dtype`` on the CPU, by :func:`op_key`."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    td = getattr(torch, dtype)
    return {op_key(op): op for op in op_db if td in op.supported_dtypes("cpu")}


def seed_of(key: str) -> int:
    """A fixed seed per op (the same samples every run, whatever else runs)."""
    return zlib.crc32(key.encode())


def samples(op: Any, n: int, dtype: str = "float32") -> list[Any]:
    """The op's first ``n`` CPU samples of ``dtype``, generated from its fixed seed."""
    import torch

    torch.manual_seed(seed_of(op_key(op)))
    gen = op.sample_inputs("cpu", getattr(torch, dtype), requires_grad=op.supports_autograd)
    out = []
    for s in gen:
        if len(out) >= n:
            break
        out.append(s)
    return out


def tolerance(op: Any, dtype: str = "float32") -> tuple[float, float]:
    """(atol, rtol): the largest CPU override for ``dtype`` among OpInfo's own
    decorators, else assert_close's defaults for it."""
    import torch

    td = getattr(torch, dtype)
    atol, rtol = DTYPE_TOL[dtype]
    for dec in getattr(op, "decorators", ()) or ():
        infos = getattr(dec, "decorators", [dec])
        if getattr(dec, "device_type", None) not in (None, "cpu"):
            continue
        dts = getattr(dec, "dtypes", None)
        if dts is not None and td not in dts:
            continue
        for d in infos:
            over = getattr(d, "d", None)
            if not isinstance(over, dict) or td not in over:
                continue
            t = over[td]
            if isinstance(t, (int, float)):  # precisionOverride: an absolute tolerance
                atol = max(atol, float(t))
            else:  # toleranceOverride: tol(atol, rtol)
                atol, rtol = max(atol, t.atol), max(rtol, t.rtol)
    return atol, rtol


# --------------------------------------------------------------------------------------
# One sample (runs in a worker).
# --------------------------------------------------------------------------------------
def _map(x: Any, fn: Callable[[Any], Any]) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map(v, fn) for v in x) if not hasattr(x, "_fields") \
            else type(x)(*(_map(v, fn) for v in x))
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    return x


def _leaves(x: Any) -> Iterator[Any]:
    import torch

    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)


def _clone(t: Any) -> Any:
    """A copy of tensor ``t`` with the same strides and storage offset (a
    non-contiguous sample stays non-contiguous), as a fresh autograd leaf."""
    import torch

    if t.layout is not torch.strided or t.is_quantized:
        return t.detach().clone().requires_grad_(t.requires_grad)
    with torch.no_grad():
        storage = t.untyped_storage().clone()
        c = torch.empty(0, dtype=t.dtype, device=t.device)
        c.set_(storage, t.storage_offset(), t.size(), t.stride())
    return c.requires_grad_(t.requires_grad)


def _fresh(sample: Any) -> tuple[Any, tuple, dict]:
    return (_map(sample.input, _clone), _map(tuple(sample.args), _clone),
            _map(dict(sample.kwargs), _clone))


def _weights(outs: list[Any], seed: int) -> list[Any]:
    import torch

    g = torch.Generator().manual_seed(seed)  # drawn in float32 whatever the outputs'
    return [(torch.rand(o.shape, generator=g) * 2 - 1).to(o.dtype) for o in outs]


def _diff_outputs(out: Any) -> list[Any]:
    return [o for o in _leaves(out) if o.requires_grad and o.dtype.is_floating_point]


def _wide(t: Any) -> Any:
    """A float64 copy of a float32 (or 16-bit float) tensor (same strides, still a
    leaf), else ``t``."""
    import torch

    if t.dtype not in {getattr(torch, d) for d in DTYPE_TOL}:
        return t
    return t.detach().to(torch.float64).requires_grad_(t.requires_grad)


def _run(fn: Callable[..., Any], sample: Any, post: Callable[[Any], Any], backward: bool,
         seed: int, wide: bool = False, watch: EagerWatch | None = None
         ) -> tuple[Any, list[Any] | None]:
    """Forward (outputs detached) and, when asked, the grads of a fixed random weighting
    of the differentiable outputs with respect to the inputs that require grad (the
    weights are the outputs' gradients: the gradient of ``sum(o * w)``, with no loss
    computed). ``wide``: the same in float64 (the float32 inputs and weights widened
    exactly). ``watch``: records what PyTorch ran outside compiled graphs."""
    import torch

    inp, args, kwargs = _fresh(sample)
    if wide:
        inp, args, kwargs = _map(inp, _wide), _map(args, _wide), _map(kwargs, _wide)
    torch.manual_seed(seed)  # random ops draw the same numbers eager and compiled
    with watch.forward() if watch is not None else contextlib.nullcontext():
        out = fn(inp, *args, **kwargs)
    grads = None
    if backward:
        leaves = [t for t in _leaves((inp, args, kwargs)) if t.requires_grad]
        diff = _diff_outputs(post(out))
        if leaves and diff:
            weights = _weights(diff, seed)
            with watch.backward() if watch is not None else contextlib.nullcontext():
                grads = list(torch.autograd.grad(diff, leaves, grad_outputs=weights,
                                                 allow_unused=True))
            grads = [torch.zeros_like(t) if g is None else g for g, t in
                     zip(grads, leaves, strict=True)]
    return _map(out, lambda t: t.detach()), grads


def _compare(got: Any, want: Any, tol: tuple[float, float], values: bool) -> None:
    import torch

    if not values:
        g, w = list(_leaves(got)), list(_leaves(want))
        if [(t.shape, t.dtype) for t in g] != [(t.shape, t.dtype) for t in w]:
            raise AssertionError(f"shapes/dtypes {[(t.shape, t.dtype) for t in g]} != "
                                 f"{[(t.shape, t.dtype) for t in w]}")
        return
    torch.testing.assert_close(got, want, atol=tol[0], rtol=tol[1], equal_nan=True,
                               check_stride=False, check_device=True)


#: The second chance of a float result outside tolerance of eager's: its error against
#: a float64 run is at most this many times eager's own (root mean square over the
#: finite elements, plus atol / 10), the rule of PyTorch's own compiler accuracy checks
#: (torch._dynamo.utils.same with fp64_ref). A sum accumulated in another order (or in
#: double, as hologram does) differs from eager's by more than float32's rtol while
#: being as close to the exact value.
F64_MULTIPLIER = 2.0


def _closer_to_f64(got: Any, want: Any, ref: Any, tol: tuple[float, float]) -> None:
    """Raise unless every float tensor of ``got`` is as close to the float64 result
    ``ref`` as :data:`F64_MULTIPLIER` allows (and everything else matches eager)."""
    import torch

    g, w, r = list(_leaves(got)), list(_leaves(want)), list(_leaves(ref))
    if not (len(g) == len(w) == len(r)):
        raise AssertionError("different numbers of tensors")
    for a, b, c in zip(g, w, r, strict=True):
        try:
            torch.testing.assert_close(a, b, atol=tol[0], rtol=tol[1], equal_nan=True,
                                       check_stride=False)
            continue
        except AssertionError:
            if not a.dtype.is_floating_point or a.shape != b.shape or a.shape != c.shape:
                raise
        a64, b64, c64 = a.double(), b.double(), c.double()
        same = (a64.isnan() == b64.isnan()) & (a64.isposinf() == b64.isposinf()) \
            & (a64.isneginf() == b64.isneginf())
        if not bool(same.all()):
            raise AssertionError("NaN or inf in other places than eager's")
        fin = a64.isfinite() & b64.isfinite() & c64.isfinite()
        err_a = float(((a64 - c64)[fin] ** 2).mean().sqrt()) if fin.any() else 0.0
        err_b = float(((b64 - c64)[fin] ** 2).mean().sqrt()) if fin.any() else 0.0
        if not err_a <= F64_MULTIPLIER * err_b + tol[0] / 10:
            raise AssertionError(f"error against float64 {err_a:.3g} > {F64_MULTIPLIER} x "
                                 f"eager's {err_b:.3g} + {tol[0] / 10:.3g}")


#: The reason given for an ATen op PyTorch ran outside every compiled graph.
EAGER = "ran in eager PyTorch outside the compiled graphs (a graph break, or a frame or " \
    "graph dynamo left to eager)"


def _route(graphs: list[Any], eager: Sequence[str]) -> tuple[str, list[str], int]:
    """(route, fallbacks, programs) of a sample: ``graphs`` the plans the backend built,
    ``eager`` the compute ops PyTorch ran outside them (:class:`EagerWatch`).

    The route counts where work ran, however many graphs dynamo made: ``hologram`` when
    a program ran and PyTorch computed nothing, neither inside a graph nor between
    graphs (a sample that graph-breaks into several graphs, all of them programs, with
    only views, allocations or ``item()`` between them, is wholly in hologram);
    ``partly`` when a program ran and PyTorch computed something too; ``torch`` when no
    program ran and PyTorch computed; ``none`` when nothing computed at all."""
    from hologram_torch.lowering import FREE_IN_EAGER

    free = {str(p) for p in FREE_IN_EAGER}
    programs = sum(len(g.regions) for g in graphs)
    fallbacks = sorted({f"{op}: {why}" for g in graphs for op, why in g.torch_ops
                        if op not in free} | {f"{op}: {EAGER}" for op in eager})
    if programs:
        return ("partly" if fallbacks else "hologram"), fallbacks, programs
    computed = fallbacks or any(g.aten_compute_nodes for g in graphs)
    return ("torch" if computed else "none"), fallbacks, 0


#: ATen ops that launch no work in eager PyTorch: views, allocations, metadata and
#: scalar reads (``item()``, the usual reason for a graph break).
FREE_ATEN = frozenset(
    "aten::" + n for n in (
        "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "expand",
        "expand_as", "t", "transpose", "permute", "unsqueeze", "squeeze", "select", "slice",
        "narrow", "split", "split_with_sizes", "chunk", "unbind", "diagonal", "unfold",
        "alias", "detach", "detach_", "lift_fresh", "view_as", "numpy_T", "mT", "real",
        "_conj", "conj", "resolve_conj", "resolve_neg", "_neg_view", "empty", "empty_like",
        "empty_strided", "new_empty", "new_empty_strided", "empty_permuted", "set_",
        "resize_", "as_strided_", "item", "_local_scalar_dense", "is_nonzero", "size",
        "stride", "sym_size", "sym_stride", "sym_numel", "dim", "is_same_size",
        "_has_compatible_shallow_copy_type", "result_type", "_to_dense"))
#: Composite ops that compute only through the ops they call (``to`` and ``contiguous``
#: copy only when they must): they count where a call inside them computes.
TRANSPARENT = frozenset("aten::" + n for n in ("to", "contiguous", "reshape", "flatten",
                                               "view_as", "type_as", "expand_as"))
#: The record the worker wraps every compiled graph's run in.
GRAPH_MARK = "hologram::graph"


class EagerWatch:
    """What PyTorch computed outside the compiled graphs during one compiled run.

    The forward call and the backward are profiled (``torch.autograd.profiler``); every
    run of a hologram graph is inside a ``hologram::graph`` record
    (:func:`_mark_graph_runs`). A forward ATen op outside such a record that is not
    free (:data:`FREE_ATEN`) was PyTorch's work: an op between graph breaks, or a
    graph dynamo or AOT autograd left to eager. Backward ops count the same way, but
    only inside autograd nodes the forward call created (sequence numbers between two
    marks taken around it: the nodes of OpInfo's ``output_process_fn_grad``, applied
    after the call, are the harness's, not the op's) that are not a compiled graph's
    backward (its wrapper's glue is not the sample's work either)."""

    def __init__(self) -> None:
        self.ops: set[str] = set()
        self._span: tuple[int, int] = (0, 0)

    @staticmethod
    def _mark() -> int:
        import torch

        with torch.enable_grad():
            return (torch.ones((), requires_grad=True) * 1.0).grad_fn._sequence_nr()

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        import torch

        lo = self._mark()
        with torch.autograd.profiler.profile() as prof:
            yield
        self._span = (lo, self._mark())
        for e in prof.function_events:
            if e.cpu_parent is None:
                self._collect(e)

    @contextlib.contextmanager
    def backward(self) -> Iterator[None]:
        import torch

        with torch.autograd.profiler.profile() as prof:
            yield
        lo, hi = self._span
        for e in prof.function_events:
            if e.name.startswith("autograd::engine::evaluate_function") \
                    and lo < e.sequence_nr < hi and not self._runs_a_graph(e):
                for c in e.cpu_children:
                    self._collect(c)

    @staticmethod
    def _runs_a_graph(e: Any) -> bool:
        """Whether autograd node ``e`` is a compiled graph's backward: what it runs outside
        the graph is the compiled function's glue (a zero gradient made for an output
        nothing differentiated, a tangent made contiguous), not the sample's ops."""
        stack = list(e.cpu_children)
        while stack:
            c = stack.pop()
            if c.name == GRAPH_MARK:
                return True
            stack.extend(c.cpu_children)
        return False

    def _collect(self, e: Any) -> None:
        """Add the compute ops at or under event ``e`` (not inside a graph's run)."""
        if e.name == GRAPH_MARK:
            return
        if not e.name.startswith("aten::") or e.name in TRANSPARENT:
            for c in e.cpu_children:
                self._collect(c)
            return
        if e.name not in FREE_ATEN:
            self.ops.add("aten." + e.name[len("aten::"):])


def _has_ties(t: Any) -> bool:
    """Whether tensor ``t`` holds some value twice."""
    import torch

    if not isinstance(t, torch.Tensor) or t.numel() < 2:
        return False
    return bool(torch.unique(t.detach()).numel() < t.numel())


def _mark_graph_runs() -> None:
    """Wrap every hologram graph's run in a :data:`GRAPH_MARK` record (once)."""
    import torch

    from hologram_torch.compile_backend import HologramGraph

    if getattr(HologramGraph, "_sweep_marked", False):
        return
    run = HologramGraph.__call__

    def marked(self: Any, *args: Any) -> Any:
        with torch.autograd.profiler.record_function(GRAPH_MARK):
            return run(self, *args)

    HologramGraph.__call__ = marked  # type: ignore[method-assign]
    HologramGraph._sweep_marked = True


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text if len(text) <= 600 else text[:600] + " ..."


def run_sample(op: Any, sample: Any, index: int, *, backward: bool = True,
               check_aot_eager: bool = True, dtype: str = "float32") -> SampleResult:
    """Compile ``op`` on one sample (of ``dtype``) with the hologram backend and compare
    with eager."""
    import torch
    import torch._dynamo

    import hologram_torch  # noqa: F401  (registers the backend)
    from hologram_torch.compile_backend import collect_graphs

    key = op_key(op)
    t0 = time.perf_counter()
    seed = seed_of(f"{key}/{index}")
    tol = tolerance(op, dtype)
    values = op.name not in METADATA_ONLY
    post = sample.output_process_fn_grad or (lambda x: x)
    backward = backward and op.supports_autograd

    def call(inp: Any, *args: Any, **kwargs: Any) -> Any:
        return op.op(inp, *args, **kwargs)

    def res(status: str, **kw: Any) -> SampleResult:
        return SampleResult(key, index, status, seconds=time.perf_counter() - t0, **kw)

    try:
        want, want_grads = _run(call, sample, post, backward, seed)
    except Exception as e:
        try:  # a forward that works without the backward still compares
            want, want_grads = _run(call, sample, post, False, seed)
            backward = False
        except Exception:
            return res("skip", detail=f"eager fails: {_short(e)}")

    def compiled(backend: str) -> tuple[Any, list[Any] | None, list[Any], list[str]]:
        """(outputs, grads, the graphs' plans, what PyTorch ran outside them) of the
        second call: the first compiles (tracing runs ops that are not the sample's)."""
        torch._dynamo.reset()
        fn = torch.compile(call, backend=backend, dynamic=False, fullgraph=False)
        watch = EagerWatch()
        with collect_graphs() as graphs:
            _run(fn, sample, post, backward, seed)
            out, grads = _run(fn, sample, post, backward, seed, watch=watch)
        return out, grads, list(graphs), sorted(watch.ops)

    wide: list[tuple[Any, list[Any] | None]] = []  # the float64 run, made when needed

    def judge(got: Any, want_: Any, part: int) -> bool:
        """Whether ``got`` matches eager within tolerance (False) or only by the float64
        rule (True); raises when it does neither."""
        try:
            _compare(got, want_, tol, values)
            return False
        except AssertionError as e:
            if not values:
                raise
            if not wide:
                try:
                    wide.append(_run(call, sample, post, want_grads is not None, seed, True))
                except Exception:
                    raise e from None
            try:
                _closer_to_f64(got, want_, wide[0][part], tol)
            except AssertionError as e2:
                raise AssertionError(f"float64 check: {e2}; {e}") from None
            return True

    def check(backend: str) -> tuple[str, str, str, list[Any], list[str], bool]:
        """(status, phase, detail, graphs, ops run eagerly outside them, judged by
        float64) under ``backend``."""
        try:
            out, grads, graphs, eager = compiled(backend)
        except Exception as e:
            return "error", "forward", _short(e), [], [], False
        try:
            by_f64 = judge(out, want, 0)
        except Exception as e:
            return "mismatch", "forward", _short(e), graphs, eager, False
        if want_grads is not None:
            try:
                by_f64 = judge(grads, want_grads, 1) or by_f64
            except Exception as e:
                return "mismatch", "backward", _short(e), graphs, eager, False
        return "match", "", "", graphs, eager, by_f64

    _mark_graph_runs()
    status, phase, detail, graphs, eager, by_f64 = check("hologram")
    if status == "mismatch" and op.name in TIES_UNSPECIFIED and _has_ties(sample.input):
        status, detail = "skip", f"{TIES} ({detail[:200]})"
    routed = status != "skip" and (graphs or status != "error")
    route, fallbacks, programs = _route(graphs, eager) if routed else (None, [], 0)
    aot = None
    if status in ("mismatch", "error") and check_aot_eager:
        aot = check("aot_eager")[0] != "match"
    torch._dynamo.reset()
    return res(status, route=route, phase=phase, detail=detail, aot_eager_fails=aot,
               fallbacks=fallbacks, programs=programs, backward=want_grads is not None,
               by_f64=by_f64)


# --------------------------------------------------------------------------------------
# Workers and the pool.
# --------------------------------------------------------------------------------------
#: Requests the tests make to see that a dying or hanging worker is reported as a crash
#: and replaced (op name -> what the worker does instead of running a sample).
SELF_TESTS: dict[str, Callable[[], None]] = {
    "__segfault__": lambda: os.kill(os.getpid(), signal.SIGSEGV),
    "__hang__": lambda: time.sleep(3600),
    "__exit__": lambda: os._exit(3),
}


def worker_main() -> None:
    """Answer requests ``{"op": key, "index": i, "n": samples, ...}`` one JSON line each.

    The protocol runs on the original stdout, which is moved aside first, so anything
    printed by PyTorch, C code or compilers goes to stderr instead."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch

    torch.set_num_threads(1)
    ops: dict[str, dict[str, Any]] = {}
    cache: dict[tuple[str, int, str], list[Any]] = {}
    for line in sys.stdin:
        req = json.loads(line)
        key, index, n = req["op"], req["index"], req["n"]
        dtype = req.get("dtype", "float32")
        if key in SELF_TESTS:
            SELF_TESTS[key]()
        try:
            if dtype not in ops:
                ops[dtype] = opinfos(dtype)
            op = ops[dtype][key]
            ck = (key, n, dtype)
            if ck not in cache:
                cache.clear()
                cache[ck] = samples(op, n, dtype)
            sample = cache[ck][index]
            r = run_sample(op, sample, index, backward=req.get("backward", True),
                           check_aot_eager=req.get("aot_eager", True), dtype=dtype)
        except Exception as e:  # a harness failure is an error of this sample, shown
            r = SampleResult(key, index, "error", detail="harness: " + _short(e)
                             + "\n" + traceback.format_exc()[-1500:])
        proto.write(r.to_json() + "\n")


def sample_counts(keys: Iterable[str], n: int, dtype: str = "float32") -> dict[str, int]:
    """How many of its first ``n`` samples of ``dtype`` each op has (generated in this
    process)."""
    ops = opinfos(dtype)
    return {k: len(samples(ops[k], n, dtype)) for k in keys}


@dataclass
class Task:
    op: str
    index: int
    n: int  # the sample count the worker should generate (indices < n)


class _Worker:
    def __init__(self, log_dir: str, number: int) -> None:
        self.log_path = os.path.join(log_dir, f"worker{number}.log")
        self.log = open(self.log_path, "ab")  # noqa: SIM115 (lives as long as the worker)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env=env, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def ask(self, task: Task, timeout: float, options: dict[str, Any]) -> SampleResult:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        req = {"op": task.op, "index": task.index, "n": task.n, **options}
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            self.proc.kill()

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        finally:
            timer.cancel()
        if line:
            return SampleResult.from_json(line)
        rc = self.proc.wait()
        if timed_out.is_set():
            why = f"timed out after {timeout:.0f} s"
        elif rc < 0:
            why = f"worker killed by signal {signal.Signals(-rc).name}"
        else:
            why = f"worker exited with status {rc}"
        return SampleResult(task.op, task.index, "crash", detail=f"{why}; log tail: "
                            + self.tail())

    def tail(self, n: int = 800) -> str:
        self.log.flush()
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Pool:
    """``workers`` worker processes; a worker that dies or times out is replaced."""

    def __init__(self, workers: int = 2, timeout: float = 180.0,
                 log_dir: str | None = None, **options: Any) -> None:
        self.workers = max(1, workers)
        self.timeout = timeout
        self.options = options
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="opinfo-sweep-")

    def run(self, tasks: Sequence[Task],
            on_result: Callable[[SampleResult], None] | None = None) -> list[SampleResult]:
        todo: queue.Queue[Task] = queue.Queue()
        for t in tasks:
            todo.put(t)
        results: list[SampleResult] = []
        lock = threading.Lock()

        def slot(number: int) -> None:
            w: _Worker | None = None
            try:
                while True:
                    try:
                        task = todo.get_nowait()
                    except queue.Empty:
                        return
                    if w is None or not w.alive:
                        if w is not None:
                            w.close()
                        w = _Worker(self.log_dir, number)
                    r = w.ask(task, self.timeout, self.options)
                    with lock:
                        results.append(r)
                        if on_result is not None:
                            on_result(r)
            finally:
                if w is not None:
                    w.close()

        threads = [threading.Thread(target=slot, args=(i,), daemon=True)
                   for i in range(self.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        order = {(t.op, t.index): i for i, t in enumerate(tasks)}
        return sorted(results, key=lambda r: order.get((r.op, r.index), 0))


def tasks_for(counts: dict[str, int], n: int) -> list[Task]:
    return [Task(op, i, n) for op, c in counts.items() for i in range(c)]


# --------------------------------------------------------------------------------------
# Summary.
# --------------------------------------------------------------------------------------
@dataclass
class Totals:
    samples: int = 0
    status: Counter = field(default_factory=Counter)
    route: Counter = field(default_factory=Counter)
    aot_also: int = 0  # mismatches/errors that aot_eager shares
    by_f64: int = 0  # matches by the float64 rule

    def add(self, r: SampleResult) -> None:
        self.samples += 1
        self.status[r.status] += 1
        self.by_f64 += r.status == "match" and r.by_f64
        if r.route:
            self.route[r.route] += 1
        if r.status in ("mismatch", "error") and r.aot_eager_fails:
            self.aot_also += 1

    def pct(self, n: int, of: int | None = None) -> str:
        of = self.samples if of is None else of
        return f"{100.0 * n / of:.2f}%" if of else "-"


def totals(results: Iterable[SampleResult]) -> Totals:
    t = Totals()
    for r in results:
        t.add(r)
    return t


def summary_markdown(results: Sequence[SampleResult], command: str = "",
                     seconds: float | None = None) -> str:
    """The sweep as markdown: totals against the targets, then one row per op."""
    by_op: dict[str, list[SampleResult]] = {}
    for r in results:
        by_op.setdefault(r.op, []).append(r)
    t = totals(results)
    compared = t.samples - t.status["skip"]
    with_compute = t.samples - t.route["none"] - t.status["skip"]
    hol = t.route["hologram"]
    lines = []
    if command:
        lines += ["Command:", "", "```", command, "```", ""]
    if seconds is not None:
        lines += [f"Ran in {seconds / 60:.1f} minutes.", ""]
    failing = t.status["mismatch"] + t.status["error"]
    lines += [
        "| total | count | share |", "|---|---|---|",
        f"| ops | {len(by_op)} | |",
        f"| samples | {t.samples} | |",
        f"| compared (not skipped) | {compared} | |",
        f"| match | {t.status['match']} | {t.pct(t.status['match'], compared)} of compared |",
        f"| ... of which by the float64 rule | {t.by_f64} | |",
        f"| mismatch or error | {failing} | {t.pct(failing, compared)} of compared |",
        f"| ... of which aot_eager fails too | {t.aot_also} | |",
        f"| crash | {t.status['crash']} | |",
        f"| skip (eager refuses the sample, or ties leave it unspecified) | {t.status['skip']} | |",
        f"| wholly in hologram | {hol} | {t.pct(hol, compared)} of compared, "
        f"{t.pct(hol, with_compute)} of those with compute |",
        f"| partly in hologram | {t.route['partly']} | {t.pct(t.route['partly'], compared)} |",
        f"| wholly in PyTorch | {t.route['torch']} | {t.pct(t.route['torch'], compared)} |",
        f"| no compute (views, metadata) | {t.route['none']} | "
        f"{t.pct(t.route['none'], compared)} |",
        "",
    ]
    unexplained = failing - t.aot_also
    match_share = t.status["match"] / compared if compared else 0.0
    lines += [
        "Against the targets (issue 17):", "",
        "| target | now | met |", "|---|---|---|",
        f"| >= 99.5% of samples match | {t.pct(t.status['match'], compared)} | "
        f"{'yes' if match_share >= 0.995 else 'no'} |",
        f"| every remaining mismatch also fails under aot_eager | {unexplained} do not | "
        f"{'yes' if unexplained == 0 else 'no'} |",
        f"| 0 crashes | {t.status['crash']} | {'yes' if t.status['crash'] == 0 else 'no'} |",
        f"| >= 60% of samples wholly inside hologram | {t.pct(hol, compared)} | "
        f"{'yes' if compared and hol / compared >= 0.6 else 'no'} |",
        "",
    ]
    fails = [r for r in results if r.status in ("mismatch", "error", "crash")]
    if fails:
        lines += ["Failing samples:", "", "| op | sample | status | phase | aot_eager fails too "
                  "| detail |", "|---|---|---|---|---|---|"]
        for r in fails:
            detail = " ".join(r.detail.split())[:240].replace("|", "\\|")
            lines.append(f"| {r.op} | {r.index} | {r.status} | {r.phase} | "
                         f"{'' if r.aot_eager_fails is None else r.aot_eager_fails} | "
                         f"{detail} |")
        lines.append("")
    falls: Counter = Counter()
    why: dict[str, str] = {}
    for r in results:
        if r.route in ("partly", "torch"):
            ops = {f.split(": ", 1)[0]: f.split(": ", 1)[-1] for f in r.fallbacks}
            falls.update(list(ops))
            for op, reason in ops.items():
                why.setdefault(op, reason)
    if falls:
        lines += ["ATen ops run in PyTorch (in how many samples; the first reason seen):", "",
                  "| ATen op | samples | reason |", "|---|---|---|"]
        lines += [f"| {op} | {n} | {' '.join(why[op].split())[:160].replace('|', '/')} |"
                  for op, n in falls.most_common()]
        lines.append("")
    lines += ["Per op:", "", "| op | samples | match | mismatch | error | crash | skip | "
              "hologram | partly | torch | none |", "|---|" + "---|" * 10]
    for op in sorted(by_op):
        o = totals(by_op[op])
        lines.append(f"| {op} | {o.samples} | " + " | ".join(
            str(o.status[s]) for s in ("match", "mismatch", "error", "crash", "skip"))
            + " | " + " | ".join(str(o.route[r]) for r in ROUTES) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__" and "--worker" in sys.argv:
    worker_main()
