"""``torch.compile(model, backend="hologram")``: FX graphs run as Atlas ISA programs.

Dynamo captures a graph, AOT autograd splits it into a forward and a backward
graph of ATen ops, and this module translates each graph into as few Atlas ISA
programs as it can: every maximal run of supported ATen ops becomes ONE program,
so the executor canonicalizes and fuses across what eager PyTorch runs as many
separate kernels. ATen ops without a translation (or with tensors hologram cannot
take: f16, complex, other devices) run in PyTorch for that node, and the
reason is logged once per op on the ``hologram_torch`` logger, so a graph never
fails or silently changes meaning because one op is missing.

The translation of each ATen op is one row of the table :data:`ATEN_TABLE` in
:mod:`hologram_torch.lowering` (one module per op family: look there to see or add
an op); what each FX node
produces (:class:`TInfo`) comes from :mod:`hologram_torch.fx_info`. This module
holds the rest: regions and plans (which nodes form which program, what runs in
PyTorch), the runners that launch a region's program on the graph's tensors, and
the compiled graph and the dynamo backend entry point.

Plans are built from the shapes dynamo recorded on each node (``meta['val']``).
When the graph has symbolic (dynamic) shapes, the first call with each new set of
input shapes runs the graph eagerly in PyTorch to learn the concrete shapes, and
later calls with the same shapes run the hologram plan: programs are static-shape
by design, so each distinct shape signature gets its own programs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.fx

from hologram.errors import DTypeError
from hologram.executor import Executor
from hologram.interop import default_executor
from hologram.isa import dtypes
from hologram.isa.builder import Var, ldg, make, stg
from hologram.isa.dtypes import DType, numpy_dtype
from hologram.isa.opcodes import Op
from hologram.isa.program import Program
from hologram.isa.value import Value, contiguous_strides
from hologram.memory.address import data_pointer
from hologram.ops import random_bits

from . import autograd_decompositions, cuda_tensors
from .derived_inputs import DerivedInput, DerivedKey
from .direct_autograd import compile_training
from .fx_info import (
    HALF,
    HALF_ROUNDS_SCALARS,
    INT_DTYPES,
    ISA_FLOAT,
    STORED,
    TORCH_OF,
    TInfo,
    _infos_from_meta,
    _Recorder,
    _signature,
)
from .layouts import OutputLayout, dense_order, row_major, traced_layout

# The op table lives in the lowering package and node infos in fx_info; the names
# callers import from here stay importable (re-exported).
from .lowering import ATEN_TABLE as ATEN_TABLE
from .lowering import (
    FREE_IN_EAGER,
    VIEW_OPS,
    Ctx,
    Unsupported,
    decompositions,
    isa_dtype,
    op_name,
    round_half,
    supported_ops,
    table_row,
)
from .lowering.linalg import batched_gemm as batched_gemm
from .packed_weights import PackedOperands
from .streams import launch_stream

__all__ = [
    "ATEN_TABLE",
    "BACKEND_NAME",
    "GraphSummary",
    "HologramGraph",
    "RegionSummary",
    "Unsupported",
    "collect_graphs",
    "hologram_backend",
    "register",
    "supported_ops",
]

log = logging.getLogger("hologram_torch")
BACKEND_NAME = "hologram"

# GEMMs whose matrix products are up to this many multiply-adds each run with one
# BLAS thread (see _BlasThreads).
SMALL_GEMM_MACS = 1 << 22


# --------------------------------------------------------------------------------------
# Regions and plans.
# --------------------------------------------------------------------------------------
@dataclass
class _Input:
    """One program input: a node's tensor, converted where its dtype is not the program's."""

    node: torch.fx.Node | DerivedKey
    isa: DType
    shape: tuple[int, ...]
    convert: bool = False  # the tensor's dtype is not the program's (bool->f32, int->f64)
    # Axis order in which the tensor was laid out when traced, if it was a permuted
    # contiguous tensor (a transposed weight saved for backward): the program reads
    # that layout and permutes it itself, so no copy is made per call.
    order: tuple[int, ...] | None = None
    # A derived input (derived_inputs.py): ``node`` is its DerivedKey, ``derived_from``
    # the graph value whose tensor ``derive`` (a one-input program) turns into it.
    derived_from: torch.fx.Node | None = None
    derive: Program | None = None
    # A seed (``_Region.random_key``): ``node`` is its SeedKey; the runner puts a fresh
    # draw from torch's default generator in the env before every launch.
    seed: bool = False


def _stored_dtypes(backend: Any) -> dict[torch.dtype, DType]:
    """The integer, bool and 16-bit float dtypes (``fx_info.STORED``, ``HALF``) whose
    tensors a program reads in place on ``backend``: every one where its memory holds
    them (host and CUDA), none of the 1-byte bool (or bf16, or f16 without the feature)
    on WebGPU. Read in place, a tensor of class labels or token ids costs the call no
    host conversion (a NumPy ``astype`` and its Python, ~10 us a call inside a training
    step: docs/perf.md, session 30). A 16-bit float tensor is read nowhere else: the
    graph's nodes of a dtype missing here run in PyTorch."""
    stored = {}
    for td, d in (*STORED.items(), *HALF.items()):
        try:
            backend.check_buffer_dtype(d)
        except DTypeError:
            continue
        stored[td] = d
    return stored


class _Region:
    """A maximal run of translated nodes that becomes one Atlas ISA program."""

    def __init__(self, number: int, devices: frozenset[str] = frozenset({"cpu"}),
                 stored: dict[torch.dtype, DType] | None = None) -> None:
        self.number = number
        self.devices = devices  # where its input tensors may be (_Plan._build)
        # Integer and bool inputs read in their own dtype (_stored_dtypes); others of
        # those dtypes are converted on the host at every call.
        self.stored = stored or {}
        # The 16-bit float dtypes its programs read and write (fx_info.HALF).
        self.halves = frozenset(td for td in self.stored if td in HALF)
        self.nodes: list[torch.fx.Node] = []
        self.env: dict[torch.fx.Node, Any] = {}
        self.inputs: list[_Input] = []
        self._by_node: dict[Any, Var] = {}  # nodes, and (node, name) of derived inputs
        self.view_only: set[torch.fx.Node] = set()
        # Filled by _finish:
        self.program: Program | None = None
        self.outputs: list[tuple[torch.fx.Node, int | None, TInfo]] = []
        # Output index -> the traced layout it is handed to PyTorch in (layouts.py);
        # outputs not here leave as dense row-major tensors.
        self.layouts: dict[int, OutputLayout] = {}
        self.mirrors: list[torch.fx.Node] = []
        self.none_outputs: list[torch.fx.Node] = []
        # Set by _Plan._plan_updates: output index -> (the graph input an in-place
        # update writes it into, that input's index in `inputs` or None if unread).
        self.updates: dict[int, tuple[torch.fx.Node, int | None]] = {}
        self.in_place: list[int] = []  # those the runner writes in place (backend agreed)
        # The copy_ node of each of those (output index -> node): the region's runner
        # finishes the update (_region_runner's hand_out), no step of its own.
        self.update_nodes: dict[int, torch.fx.Node] = {}
        # Values computed from one input alone may be derived inputs (_Plan decides).
        self.derives = False
        self.streams = 0  # random streams handed out (random_key)

    def load(self, node: torch.fx.Node, info: TInfo) -> Var:
        v = self._by_node.get(node)
        if v is not None:
            return v
        if info.device not in self.devices:
            raise Unsupported(f"input on device {info.device} (this executor takes tensors "
                              f"on {', '.join(sorted(self.devices))})")
        if info.dtype in ISA_FLOAT:
            spec = _Input(node, ISA_FLOAT[info.dtype], info.shape)
        elif info.dtype in self.stored:
            spec = _Input(node, self.stored[info.dtype], info.shape)
        elif info.dtype is torch.bool:
            spec = _Input(node, dtypes.f32, info.shape, convert=True)
        elif info.dtype in INT_DTYPES:
            spec = _Input(node, dtypes.f64, info.shape, convert=True)
        else:
            raise Unsupported(f"input dtype {info.dtype}")
        order = _physical_order(node)
        if order is not None:
            spec.order = order
            spec.shape = tuple(info.shape[d] for d in order)
        v = Var(ldg(len(self.inputs), spec.isa, spec.shape))
        if order is not None:
            v = v.permute(tuple(order.index(d) for d in range(len(order))))
        v = v.cast(isa_dtype(info.dtype))  # the value's dtype in programs (ints: f64)
        self.inputs.append(spec)
        self._by_node[node] = v
        return v

    def derive(self, v: Var, name: str, fn: Callable[[Var], Var]) -> Var:
        """``fn(v)``: inline, or, where ``v`` is an input of this region read as it is
        and the region derives inputs, a program input of its own computed from ``v``'s
        tensor by ``fn``'s program and kept while that tensor is unchanged
        (``derived_inputs.py``: a Winograd convolution's transformed weight)."""
        src = v.v
        if not self.derives or src.op is not Op.LDG:
            return fn(v)
        spec = self.inputs[src.attr("in")]
        if spec.convert or spec.order is not None or spec.derive is not None:
            return fn(v)
        memo = (spec.node, name)
        done = self._by_node.get(memo)
        if done is not None:
            return done
        program = _program_of(fn, src)
        (isa, shape), = program.output_specs
        key = DerivedKey(f"{name}({spec.node.name})")
        self.inputs.append(_Input(key, isa, shape, derived_from=spec.node, derive=program))
        out = Var(ldg(len(self.inputs) - 1, isa, shape))
        self._by_node[memo] = out
        return out

    def random_key(self) -> tuple[Var, int]:
        """(the region's seed, a stream of the asking node's own): one seed input per
        program, drawn at every call (``_region_runner``), and a stream number per
        random node, so two dropouts of one program draw different numbers."""
        seed = self._by_node.get(SeedKey)
        if seed is None:
            self.inputs.append(_Input(SeedKey(f"seed{self.number}"), dtypes.i32, (), seed=True))
            seed = Var(ldg(len(self.inputs) - 1, dtypes.i32, ()))
            self._by_node[SeedKey] = seed
        self.streams += 1
        return seed, self.streams - 1

    def snapshot(self) -> tuple[int, dict]:
        return len(self.inputs), dict(self._by_node)

    def rollback(self, snap: tuple[int, dict]) -> None:
        n, by_node = snap
        del self.inputs[n:]
        self._by_node = by_node


def _program_of(fn: Callable[[Var], Var], src: Value) -> Program:
    """``fn`` as a program of one input shaped and typed as ``src``."""
    out = fn(Var(ldg(0, src.dtype, src.shape)))
    return Program([stg(out.v, 0)], [(src.dtype, src.shape)])


def _renumber(outputs: list[Var], inputs: list[_Input]) -> tuple[list[Value], list[_Input]]:
    """Drop program inputs nothing reads (a translation may load and not use one)."""
    stores = [stg(o.v, i) for i, o in enumerate(outputs)]
    used = sorted({v.attr("in") for s in stores for v in s.walk() if v.op is Op.LDG})
    if used == list(range(len(inputs))):
        return stores, inputs
    new_index = {old: new for new, old in enumerate(used)}
    memo: dict[int, Value] = {}
    for s in stores:  # post-order: every source is rebuilt before its readers
        for v in s.walk():  # (no recursion: a whole model's program is deep)
            if id(v) in memo or v.op is Op.STG:
                continue
            memo[id(v)] = (ldg(new_index[v.attr("in")], v.dtype, v.shape) if v.op is Op.LDG
                           else make(v.op, [memo[id(x)] for x in v.srcs], dict(v.attrs),
                                     v.dtype, v.shape))
    stores = [stg(memo[id(o.v)], i) for i, o in enumerate(outputs)]
    return stores, [inputs[i] for i in used]


@dataclass
class RegionSummary:
    """What one program of a graph holds and what compiling it did."""

    number: int
    aten_ops: Counter
    instructions_before: int
    instructions_after: int
    launches_before: int
    launches_after: int
    fused: bool
    kernels: list[str] = field(default_factory=list)
    program_text: str = ""
    source: str = ""
    # Graph inputs the program updates by writing into them (no output, no copy_).
    in_place_updates: int = 0


@dataclass
class GraphSummary:
    """One FX graph the backend compiled: its regions and the nodes left to PyTorch."""

    kind: str
    aten_nodes: int
    aten_compute_nodes: int  # ATen nodes that are not views: eager launches work for these
    torch_ops: list[tuple[str, str]]  # (op, reason), one per node that ran in PyTorch
    executor: str
    # The call that built this plan ran the whole graph in PyTorch: under dynamic shapes
    # a new shape signature is run eagerly once to record its shapes, and the programs
    # above run from the next call with those shapes.
    ran_in_pytorch: bool = False
    # The regions' summaries read their compiled programs, which build in the
    # background (_Plan._resolve): made on first read, waiting for the builds.
    summarize_regions: Callable[[], list[RegionSummary]] = field(default=list, repr=False)
    _regions: list[RegionSummary] | None = field(default=None, repr=False)

    @property
    def regions(self) -> list[RegionSummary]:
        if self._regions is None:
            self._regions = self.summarize_regions()
        return self._regions

    @property
    def hologram_ops(self) -> Counter:
        total: Counter = Counter()
        for r in self.regions:
            total.update(r.aten_ops)
        return total


_COLLECTORS: list[list[GraphSummary]] = []
_COLLECT_LOCK = threading.Lock()


@contextlib.contextmanager
def collect_graphs() -> Iterator[list[GraphSummary]]:
    """Collect a GraphSummary for every plan built inside the block (for explain)."""
    sink: list[GraphSummary] = []
    with _COLLECT_LOCK:
        _COLLECTORS.append(sink)
    try:
        yield sink
    finally:
        with _COLLECT_LOCK:
            _COLLECTORS.remove(sink)


_LOGGED: set[tuple[str, str]] = set()


def _log_fallback(op: str, reason: str) -> None:
    key = (op, reason)
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.warning("hologram_torch: %s runs in PyTorch: %s", op, reason)


def _kernel_names(compiled: Any) -> list[str]:
    low = getattr(compiled, "lowered", None)
    if low is None:
        return []
    names = []
    for st in low.schedule.steps:
        names.append(getattr(st, "name", None) or f"gemm{list(st.value.shape)}")
    return names


def _summarize(region: _Region, ex: Executor) -> RegionSummary:
    from hologram.compiler.lower import compute_instructions, unfused_launches

    assert region.program is not None
    compiled = ex.compile(region.program)
    stats = getattr(compiled, "stats", None)
    ops = Counter(op_name(n.target) for n in region.nodes if n.target is not operator.getitem)
    if stats is not None:
        return RegionSummary(region.number, ops, stats.instructions_before,
                             stats.instructions_after, stats.launches_before,
                             stats.launches_after, True, _kernel_names(compiled),
                             region.program.text, getattr(compiled, "source", "") or "",
                             len(region.in_place))
    # A backend that interprets the program (reference) runs each instruction alone.
    n_inst = compute_instructions(region.program)
    n_launch = unfused_launches(region.program)
    return RegionSummary(region.number, ops, n_inst, n_inst, n_launch, n_launch, False, [],
                         region.program.text, "")


class _Plan:
    """Steps that run one graph for one set of concrete shapes."""

    def __init__(self, gm: torch.fx.GraphModule, infos: dict[torch.fx.Node, Any],
                 ex: Executor, kind: str, blas_threads: Any = "auto",
                 pack_weights: bool = True) -> None:
        self.ex = ex
        self.kind = kind
        self.blas_threads = blas_threads
        # GEMMs read packed copies of constant weights: inference graphs only (training
        # updates its weights every step)
        self.pack = pack_weights and kind == "inference"
        self.torch_nodes: list[tuple[torch.fx.Node, str]] = []
        self.regions: list[_Region] = []
        self.steps: list[tuple[str, Any]] = []  # ("torch", node) | ("region", _Region)
        self.placeholders: list[torch.fx.Node] = []
        self.output_args: Any = None
        # copy_(graph input, value) nodes: the in-place updates AOT autograd keeps in
        # inference graphs (keep_inference_input_mutations), e.g. an optimizer step's.
        self.updates: dict[torch.fx.Node, tuple[torch.fx.Node, torch.fx.Node]] = {}
        self._build(gm, infos)
        self._gm = gm
        # The programs' native builds run on other threads while AOT autograd and
        # dynamo finish their own work after this plan (the C compiler on another
        # core); the first call waits for them and makes the runners (_resolve).
        self._compiling = [ex.compile_in_background(p) for r in self.regions
                           for p in (r.program, *(s.derive for s in r.inputs if s.derive))]
        self._resolve_lock = threading.Lock()
        # (runner, values dead after it) per step, paired once for the per-call loop.
        self._schedule: list[tuple[Callable[[dict[torch.fx.Node, Any]], None],
                                   list[torch.fx.Node]]] | None = None
        self._read_outputs = _arg_reader(self.output_args)
        self.summary = GraphSummary(
            kind,
            sum(1 for n in gm.graph.nodes if isinstance(n.target, torch._ops.OpOverload)),
            sum(1 for n in gm.graph.nodes if isinstance(n.target, torch._ops.OpOverload)
                and n.target.overloadpacket not in FREE_IN_EAGER),
            [(op_name(n.target), why) for n, why in self.torch_nodes],
            ex.backend_name,
            summarize_regions=self._region_summaries,
        )

    def _resolve(self) -> list[tuple[Callable[[dict[torch.fx.Node, Any]], None],
                                     list[torch.fx.Node]]]:
        """The per-call schedule, made once the background compiles have finished (a
        compile's error is raised here, at the first call)."""
        with self._resolve_lock:
            if self._schedule is None:
                for f in self._compiling:
                    f.result()
                runners = [self._make_runner(kind_, obj, self._gm) for kind_, obj in self.steps]
                self._schedule = _without_empty_steps(runners, self._free_lists())
            return self._schedule

    @functools.cached_property
    def _update_sites(self) -> dict[torch.fx.Node, tuple[_Region, int]]:
        """Each copy_ node a region may write in place: (that region, its output)."""
        return {node: (r, k) for r in self.regions for k, node in r.update_nodes.items()}

    def _region_summaries(self) -> list[RegionSummary]:
        self._resolve()  # the runners decide which updates are written in place
        return [_summarize(r, self.ex) for r in self.regions]

    # --- planning ------------------------------------------------------------------
    def _build(self, gm: torch.fx.GraphModule, infos: dict[torch.fx.Node, Any]) -> None:
        region_of: dict[torch.fx.Node, _Region] = {}
        open_region: _Region | None = None
        # One device for every tensor of the graph: the CPU's (host arrays, any
        # executor), or CUDA's with a cuda executor (cuda_tensors.py: shared through
        # DLPack). A graph mixing them (a CPU scalar tensor beside CUDA ones) runs in
        # PyTorch.
        devices = frozenset(i.device for i in infos.values() if isinstance(i, TInfo))
        takes = frozenset({"cuda"} if self.ex.backend.device_type == "cuda" else ()) | {"cpu"}
        stored = _stored_dtypes(self.ex.backend)
        one_usable_device = len(devices) <= 1 and devices <= takes

        def flush() -> None:
            nonlocal open_region
            if open_region is not None and open_region.nodes:
                self.regions.append(open_region)
                self.steps.append(("region", open_region))
            open_region = None

        def to_torch(node: torch.fx.Node, reason: str | None) -> None:
            # A PyTorch node runs where it stands, before the open region, unless it
            # reads the region's results or may write memory the region reads.
            deps = node.all_input_nodes
            if open_region is not None and (
                    _may_mutate(node) or any(region_of.get(d) is open_region for d in deps)):
                flush()
            if reason is not None:
                self.torch_nodes.append((node, reason))
                if isinstance(node.target, torch._ops.OpOverload):
                    _log_fallback(op_name(node.target), reason)
            self.steps.append(("torch", node))

        for node in gm.graph.nodes:
            if node.op == "placeholder":
                self.placeholders.append(node)
                continue
            if node.op == "output":
                self.output_args = node.args[0]
                continue
            if node.op != "call_function":
                to_torch(node, None)
                continue
            if node.target is operator.getitem:
                src = node.args[0]
                r = region_of.get(src)
                if r is not None:
                    r.env[node] = r.env[src][node.args[1]]
                    r.nodes.append(node)
                    region_of[node] = r
                    if src in r.view_only:
                        r.view_only.add(node)
                else:
                    to_torch(node, None)
                continue
            if _is_input_update(node):
                self.updates[node] = (node.args[0], node.args[1])
                to_torch(node, None)
                continue
            row = table_row(node.target)
            if row is None:
                reason = (f"no hologram translation for {op_name(node.target)}"
                          if isinstance(node.target, torch._ops.OpOverload) else None)
                to_torch(node, reason)
                continue
            if not one_usable_device:
                to_torch(node, f"graph tensors are on {', '.join(sorted(devices))}; this "
                               f"executor takes tensors on one of {', '.join(sorted(takes))}")
                continue
            if open_region is None:
                open_region = _Region(len(self.regions), devices or frozenset({"cpu"}),
                                      stored)
                # kept values read by the CPU launch paths: inference graphs only, as
                # packed weights (derived_inputs.py)
                open_region.derives = self.pack and self.ex.backend.device_type == "cpu" \
                    and open_region.devices == frozenset({"cpu"})
            try:
                self._translate(node, row, infos, open_region, region_of)
            except Unsupported as e:
                to_torch(node, str(e))
            except Exception as e:  # a translation bug or an ISA rule: never hide it
                to_torch(node, f"translation failed: {type(e).__name__}: {e}")
        flush()
        for r in self.regions:
            self._finish(r, region_of, infos)
        self._plan_updates(region_of, infos)
        # A region whose outputs are all views is nothing but PyTorch views.
        kept = []
        for kind, obj in self.steps:
            if kind == "region" and obj.program is None:
                kept.extend(("torch", n) for n in obj.mirrors)
                kept.extend(("none", n) for n in obj.none_outputs)
                continue
            kept.append((kind, obj))
            if kind == "region":  # after it: a mirror may view what the region stores
                kept.extend(("torch", n) for n in obj.mirrors)
        self.steps = kept
        self.regions = [r for r in self.regions if r.program is not None]
        for i, r in enumerate(self.regions):
            r.number = i

    def _translate(self, node: torch.fx.Node, row: Callable[..., Any],
                   infos: dict[torch.fx.Node, Any], region: _Region,
                   region_of: dict[torch.fx.Node, _Region]) -> None:
        out = infos[node]
        outs = out if isinstance(out, tuple) else (out,)
        for o in outs:
            if isinstance(o, TInfo) and o.dtype not in ISA_FLOAT and o.dtype is not torch.bool \
                    and o.dtype not in INT_DTYPES and o.dtype not in region.halves:
                raise Unsupported(f"result dtype {o.dtype}")
        snap = region.snapshot()
        try:
            def arg(a: Any) -> Any:
                if isinstance(a, torch.fx.Node):
                    if region_of.get(a) is region:
                        return region.env[a]
                    info = infos[a]
                    if isinstance(info, TInfo):
                        return region.load(a, info)
                    if isinstance(info, tuple):
                        raise Unsupported("takes a multi-output value from outside the region")
                    return info
                if isinstance(a, (list, tuple)):
                    return type(a)(arg(x) for x in a)
                return a

            args = _half_scalars(node, [arg(a) for a in node.args], infos)
            kwargs = {k: arg(v) for k, v in node.kwargs.items()}
            result = row(Ctx(node, out, region.derive, region.random_key), *args, **kwargs)
            self._check_result(node, result, out)
            result = _rounded(result, out)
        except BaseException:
            region.rollback(snap)
            raise
        region.env[node] = result
        region.nodes.append(node)
        region_of[node] = region
        if node.target.overloadpacket in VIEW_OPS:
            srcs = [a for a in node.all_input_nodes]
            if all(region_of.get(s) is not region or s in region.view_only for s in srcs):
                region.view_only.add(node)

    @staticmethod
    def _check_result(node: torch.fx.Node, result: Any, out: Any) -> None:
        res = result if isinstance(result, tuple) else (result,)
        outs = out if isinstance(out, tuple) else (out,)
        if len(res) != len(outs):
            raise Unsupported(f"translation gave {len(res)} results, ATen gives {len(outs)}")
        for r, o in zip(res, outs, strict=True):
            if r is None or not isinstance(o, TInfo):
                continue
            if not isinstance(r, Var):
                raise Unsupported(f"translation gave {type(r).__name__}, not a tensor")
            if tuple(r.shape) != o.shape:
                raise Unsupported(f"translation shape {list(r.shape)} differs from ATen's "
                                  f"{list(o.shape)}")
            if r.dtype is not isa_dtype(o.dtype):
                raise Unsupported(f"translation dtype {r.dtype} differs from ATen's {o.dtype}")

    def _finish(self, r: _Region, region_of: dict[torch.fx.Node, _Region],
                infos: dict[torch.fx.Node, Any]) -> None:
        """Decide the region's outputs (values used elsewhere) and build its program."""
        needed: list[torch.fx.Node] = []
        for n in r.nodes:
            if isinstance(infos[n], tuple):
                continue  # multi-output values leave through their getitems
            if any(region_of.get(u) is not r for u in n.users):
                needed.append(n)
        mirrors: list[torch.fx.Node] = []
        # Values the program stores. Free views of one value (AOT autograd saves both
        # `relu` and `detach(relu)`, or `detach(softmax)` and `view(expand(softmax))`,
        # for backward) are made by PyTorch from that value, stored once: aliases, as
        # in eager, instead of one copy per view.
        stored = {n for n in needed if n not in r.view_only and r.env[n] is not None}
        by_base: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        for n in stored:
            by_base.setdefault(_view_base(n, region_of, r), []).append(n)
        for base, group in by_base.items():
            if (base in stored or len(group) > 1) and base not in r.view_only \
                    and isinstance(r.env.get(base), Var):
                stored -= set(group)
                stored.add(base)
        # A view that drops elements (a slice) of a value stored anyway is made too.
        stored -= {n for n in stored if _view_of(n, stored | r.view_only, region_of, r)}

        def mirror(n: torch.fx.Node) -> None:
            if n in mirrors:
                return
            for s in n.all_input_nodes:
                if region_of.get(s) is r and s not in stored:
                    mirror(s)
            mirrors.append(n)

        outs = [(n, r.env[n], infos[n]) for n in r.nodes if n in stored]
        for n in needed:
            if r.env[n] is None:  # e.g. a gradient output_mask did not ask for
                r.none_outputs.append(n)
            elif n not in stored:  # a view of an input or of a stored value: PyTorch
                mirror(n)          # makes it, no copy
        order = {n: i for i, n in enumerate(r.nodes)}
        r.mirrors = sorted(mirrors, key=order.__getitem__)
        if not outs:
            return
        # Bools leave as f32 (the carrier); 16-bit floats in their own dtype.
        vars_ = [v.cast(HALF[i.dtype]) if isinstance(i, TInfo) and i.dtype in HALF else
                 v if v.dtype is not dtypes.boolean else v.cast(dtypes.f32)
                 for _, v, i in outs]
        # Values leave with the strides the trace recorded: a permuted dense layout is
        # stored permuted (PyTorch gets a view); another one is copied into, where
        # PyTorch reads the value (a node it runs, a view it makes, a graph output).
        in_torch = set(r.mirrors)
        for i, (n, _, _) in enumerate(outs):
            read_by_torch = any(u in in_torch or region_of.get(u) is None
                                or u in region_of[u].view_only for u in n.users)
            layout = traced_layout(n, copy_ok=read_by_torch)
            if layout is not None:
                r.layouts[i] = layout
                if layout.order is not None:
                    vars_[i] = vars_[i].permute(layout.order)
        stores, r.inputs = _renumber(vars_, r.inputs)
        r.program = Program(stores, [(s.isa, s.shape) for s in r.inputs],
                            name=f"{self.kind}_region{r.number}")
        r.outputs = [(n, i, info) for i, (n, _, info) in enumerate(outs)]

    def _plan_updates(self, region_of: dict[torch.fx.Node, _Region],
                      infos: dict[torch.fx.Node, Any]) -> None:
        """Mark updates a region may write straight into the graph input.

        ``copy_(x, v)`` at the end of a graph, with ``v`` stored by a region, costs an
        output allocation and a copy per call. The region can store ``v`` into ``x``
        instead when every other reader of ``x`` and of ``v`` is in that region (no
        later step wants the old ``x`` or sees ``v`` alias it); they agree in dtype
        and shape; and the backend proves, per compiled program, that no read of ``x``
        sees a written element (``Backend.may_overwrite``, checked by the runner).
        """
        counts = Counter(dst for dst, _ in self.updates.values())
        for node, (dst, src) in self.updates.items():
            r = region_of.get(src)
            if r is None or r.program is None or counts[dst] > 1:
                continue
            if any(u is not node and region_of.get(u) is not r for u in (*src.users, *dst.users)):
                continue
            k = next((i for n, i, _ in r.outputs if n is src), None)
            di, si = infos.get(dst), infos.get(src)
            if k is None or k in r.layouts or not (isinstance(di, TInfo)
                                                   and isinstance(si, TInfo)):
                continue
            if (di.dtype is not si.dtype or di.shape != si.shape
                    or _carrier(di.dtype) is not di.dtype):
                continue
            j = next((i for i, spec in enumerate(r.inputs) if spec.node is dst), None)
            if j is not None and (r.inputs[j].convert or r.inputs[j].order is not None):
                continue
            r.updates[k] = (dst, j)
            r.update_nodes[k] = node

    # --- running -------------------------------------------------------------------
    def _make_runner(self, kind: str, obj: Any, gm: torch.fx.GraphModule
                     ) -> Callable[[dict[torch.fx.Node, Any]], None] | None:
        """The step's runner; None for an update its region's runner finishes (made
        first: runners are made in step order, and a region comes before its updates)."""
        if kind == "torch" and obj in self.updates:
            r, k = self._update_sites.get(obj, (None, None))
            if r is not None and k in r.in_place:
                return None
            return _update_runner(obj, *self.updates[obj])
        if kind == "torch":
            return _torch_runner(obj, gm)
        if kind == "none":
            return lambda env: env.__setitem__(obj, None)
        return _region_runner(obj, self.ex, self.blas_threads, self.pack)

    def _free_lists(self) -> list[list[torch.fx.Node]]:
        """After which step each value is dead, so memory is released as eager would."""
        last: dict[torch.fx.Node, int] = {}

        def uses(kind: str, obj: Any) -> list[torch.fx.Node]:
            if kind == "torch":
                return list(obj.all_input_nodes)
            if kind == "none":
                return []
            return [n for s in obj.inputs for n in (s.node, s.derived_from)
                    if n is not None]

        for i, (kind, obj) in enumerate(self.steps):
            for n in uses(kind, obj):
                last[n] = i
        keep = set()
        torch.fx.node.map_arg(self.output_args, keep.add)
        frees: list[list[torch.fx.Node]] = [[] for _ in self.steps]
        for n, i in last.items():
            if n not in keep:
                frees[i].append(n)
        return frees

    def run(self, args: list[Any]) -> Any:
        schedule = self._schedule if self._schedule is not None else self._resolve()
        env: dict[torch.fx.Node, Any] = dict(zip(self.placeholders, args, strict=True))
        args.clear()  # boxed call: let inputs die when their last user has run
        for runner, frees in schedule:
            runner(env)
            for n in frees:
                env.pop(n, None)
        return self._read_outputs(env)


def _without_empty_steps(runners: list[Any], frees: list[list[torch.fx.Node]]
                         ) -> list[tuple[Callable[[dict[torch.fx.Node, Any]], None],
                                         list[torch.fx.Node]]]:
    """(runner, values dead after it) for each step that has a runner; a step without
    one (an update its region finished) hands the values that die there to the step
    before it, which is where they last are used then."""
    out: list[tuple[Any, list[torch.fx.Node]]] = []
    for runner, dead in zip(runners, frees, strict=True):
        if runner is not None:
            out.append((runner, list(dead)))
        elif out:
            out[-1][1].extend(dead)
    return out


def _view_of(n: torch.fx.Node, available: set[torch.fx.Node],
             region_of: dict[torch.fx.Node, _Region], r: _Region) -> bool:
    """Whether ``n`` is a view op eager PyTorch makes for free (detach, t, view, ...)
    whose tensor operands from region ``r`` are all in ``available``."""
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
        return False
    if n.target.overloadpacket not in FREE_IN_EAGER:
        return False
    srcs = [s for s in n.all_input_nodes if region_of.get(s) is r]
    return bool(srcs) and all(s in available and s is not n for s in srcs)


#: Free views that keep every element of their source: storing the source instead of
#: such a view never stores more (a slice's source can be much larger than the slice).
_WHOLE_VIEWS = FREE_IN_EAGER - {torch.ops.aten.slice, torch.ops.aten.narrow,
                                torch.ops.aten.split, torch.ops.aten.split_with_sizes,
                                torch.ops.aten.chunk, torch.ops.aten.select}


def _view_base(n: torch.fx.Node, region_of: dict[torch.fx.Node, _Region],
               r: _Region) -> torch.fx.Node:
    """The value of region ``r`` that ``n`` is a view of, through a chain of views
    eager PyTorch makes for free and that keep every element (detach, t, view,
    expand, ...); ``n`` itself if it is not such a view."""
    while (n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
           and n.target.overloadpacket in _WHOLE_VIEWS):
        srcs = [s for s in n.all_input_nodes if region_of.get(s) is r]
        if len(srcs) != 1 or isinstance(r.env.get(srcs[0]), tuple):
            break
        n = srcs[0]
    return n


def _is_input_update(node: torch.fx.Node) -> bool:
    """``copy_(graph input, value)``: how AOT autograd writes back an input mutation."""
    return (node.target is torch.ops.aten.copy_.default and len(node.args) == 2
            and not node.kwargs.get("non_blocking", False)
            and all(isinstance(a, torch.fx.Node) for a in node.args)
            and node.args[0].op == "placeholder")


def _update_runner(node: torch.fx.Node, dst: torch.fx.Node, src: torch.fx.Node
                   ) -> Callable[[dict[torch.fx.Node, Any]], None]:
    """``dst.copy_(src)``, skipped when the region already wrote ``src`` into ``dst``."""
    def update(env: dict[torch.fx.Node, Any]) -> None:
        d, s = env[dst], env[src]
        if s is not d:
            d.copy_(s)
        env[node] = d

    return update


def _may_mutate(node: torch.fx.Node) -> bool:
    """Whether a node may write memory (ATen ops say so in their schema)."""
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return t._schema.is_mutable
    if node.op == "call_function" and getattr(t, "__module__", None) in ("_operator", "math"):
        return False  # getitem, SymInt arithmetic
    return node.op not in ("get_attr", "placeholder")


def _resolve_attr(gm: torch.fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _torch_runner(node: torch.fx.Node, gm: torch.fx.GraphModule
                  ) -> Callable[[dict[torch.fx.Node, Any]], None]:
    if node.op == "get_attr":
        value = _resolve_attr(gm, node.target)

        def get(env: dict[torch.fx.Node, Any]) -> None:
            env[node] = value

        return get
    if node.op == "call_module":
        fn: Any = _resolve_attr(gm, node.target)
    elif node.op == "call_method":
        def fn(self_: Any, *a: Any, **k: Any) -> Any:
            return getattr(self_, node.target)(*a, **k)
    else:
        fn = node.target
    read_args = _arg_reader(tuple(node.args))
    if not node.kwargs:
        def call(env: dict[torch.fx.Node, Any]) -> None:
            env[node] = fn(*read_args(env))

        return call
    read_kwargs = _arg_reader(dict(node.kwargs))

    def call_kw(env: dict[torch.fx.Node, Any]) -> None:
        env[node] = fn(*read_args(env), **read_kwargs(env))

    return call_kw


def _arg_reader(arg: Any) -> Callable[[dict[torch.fx.Node, Any]], Any]:
    """A function that rebuilds an FX argument structure from the values in ``env``.

    Built once per node: ``torch.fx.node.map_arg`` walks the structure generically on
    every call, and the steps around a program run once per training step, where
    each Python-level microsecond is paid on every step (docs/perf.md, session 5).
    Lists come back as lists and tuples as tuples; constants as themselves.
    """
    if isinstance(arg, torch.fx.Node):
        return operator.itemgetter(arg)
    if isinstance(arg, (tuple, list)):
        kind = tuple if isinstance(arg, tuple) else list
        parts = [_arg_reader(a) for a in arg]
        return lambda env: kind([p(env) for p in parts])
    if isinstance(arg, dict):
        items = [(k, _arg_reader(v)) for k, v in arg.items()]
        return lambda env: {k: p(env) for k, p in items}
    if isinstance(arg, slice):
        lo, hi, st = (_arg_reader(x) for x in (arg.start, arg.stop, arg.step))
        return lambda env: slice(lo(env), hi(env), st(env))
    return lambda env: arg


def _physical_order(node: torch.fx.Node) -> tuple[int, ...] | None:
    """The axis order of a traced tensor that is a permutation of a contiguous one
    (and not contiguous itself), from its strides; None otherwise."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.ndim < 2:
        return None
    shape, strides = tuple(val.shape), tuple(val.stride())
    if any(not isinstance(x, int) for x in (*shape, *strides)):
        return None  # symbolic sizes: no fixed layout to plan for
    if row_major(shape, strides):
        return None
    return dense_order(shape, strides)


class SeedKey(DerivedKey):
    """The env key of a program's seed input (``_Region.random_key``)."""

    __slots__ = ()


def draw_seed() -> torch.Tensor:
    """A seed for one launch: a 0-d int32 from torch's default generator, so
    ``torch.manual_seed`` makes a compiled model's random ops repeat, as eager's do."""
    return torch.randint(random_bits.SEED_RANGE, (), dtype=torch.int32)


def host_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's memory as a NumPy array, no copy. NumPy has no bfloat16 and
    ``Tensor.numpy()`` refuses it: a bf16 tensor is read through its bits as ml_dtypes'
    bfloat16 (a DTypeError naming the package where it is missing)."""
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(numpy_dtype(dtypes.bf16, "a bf16 tensor"))
    return t.numpy()


def _host_array(t: torch.Tensor, spec: _Input) -> np.ndarray:
    """The NumPy view (or contiguous copy) of a tensor a program reads.

    Everything here is on the hot path of every call, so it stays in NumPy once
    the tensor is viewed: a torch op costs microseconds of dispatch each.
    """
    if t.requires_grad:
        t = t.detach()
    if t.device.type != "cpu":
        raise RuntimeError(f"hologram_torch: tensor on {t.device}; the backend runs on the CPU")
    if spec.order is not None:
        t = t.permute(spec.order)  # the traced layout: contiguous again, unless it changed
    if not t.is_contiguous():
        t = t.contiguous()
    a = host_numpy(t)
    if a.shape != spec.shape:
        raise RuntimeError(f"hologram_torch: planned for shape {list(spec.shape)}, "
                           f"got {list(a.shape)}")
    if spec.convert:
        a = a.astype(spec.isa.np_dtype)
    elif a.dtype != spec.isa.np_dtype:
        raise RuntimeError(f"hologram_torch: planned for {spec.isa}, got {a.dtype}")
    return a


class _BlasThreads:
    """Caps NumPy's BLAS threads while a program with small GEMMs runs.

    The CPU executor hands GEMMs to the BLAS NumPy links (OpenBLAS, with its own
    thread pool). Inside a PyTorch process, PyTorch's OpenMP pool holds the cores
    too, and the two pools spin against each other: a 64x64x256 sgemm measured
    1.8 ms after a torch matmul against 13-20 us alone, which made a small MLP's
    training step ~80x slower than eager. Small GEMMs gain nothing from threads,
    so they run on one; large ones keep BLAS's own setting.
    """

    _libs: list[Any] | None = None

    @classmethod
    def libs(cls) -> list[Any]:
        if cls._libs is None:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:
                log.info("hologram_torch: threadpoolctl is not installed; NumPy's BLAS threads "
                         "are left as they are (small GEMMs may contend with PyTorch's pool)")
                cls._libs = []
            else:
                ctl = ThreadpoolController().select(user_api="blas")
                cls._libs = list(ctl.lib_controllers)
        return cls._libs

    def __init__(self, threads: int | None) -> None:
        self.threads = threads
        self._saved: list[int] = []

    def __enter__(self) -> None:
        if self.threads is not None:
            for lib in self.libs():
                self._saved.append(lib.get_num_threads())
                lib.set_num_threads(self.threads)

    def __exit__(self, *exc: object) -> None:
        for lib, n in zip(self.libs(), self._saved, strict=False):
            lib.set_num_threads(n)
        self._saved.clear()


def _blas_threads_for(program: Program, setting: Any) -> int | None:
    """The BLAS thread cap for ``program`` under the ``blas_threads`` option.

    "auto" caps nothing when the CPU backend runs GEMMs itself (hologram's OpenMP
    tiles over one-thread BLAS calls, ``hologram.compiler.blas``): there is no second
    pool to contend with. The cap matters only where GEMMs stay ``np.matmul``.
    """
    if setting is None or isinstance(setting, int):
        return setting
    from hologram.compiler import blas

    if blas.provider()[0] is not None:
        return None
    macs = [_matrix_macs(v) for v in program.instructions if v.op is Op.GEMM]
    if not macs:
        return None
    return 1 if max(macs) <= SMALL_GEMM_MACS else None


def _matrix_macs(gemm: Value) -> int:
    """Multiply-adds of ONE matrix product of a (batched) GEMM, ``m * k * n``: BLAS is
    called (and decides its threads) per matrix of a batch, so a batch of small
    products is as small, for this purpose, as one of them."""
    (*_, m, k), n = gemm.srcs[0].shape, gemm.srcs[1].shape[-1]
    return m * k * n


def _half_scalars(node: torch.fx.Node, args: list[Any], infos: dict[torch.fx.Node, Any]
                  ) -> list[Any]:
    """``args`` with a Python-number operand rounded to the 16-bit float dtype of the
    op's tensor operands, where eager's kernel rounds it (``fx_info.HALF_ROUNDS_SCALARS``:
    ``x > 0.1`` compares with bf16's 0.10009765625, so a value equal to it is not
    greater). Only the two operand positions; ``alpha`` and the like stay float."""
    packet = getattr(node.target, "overloadpacket", None)
    if packet is None or packet.__name__ not in HALF_ROUNDS_SCALARS:
        return args
    dts = {infos[a].dtype for a in node.args[:2]
           if isinstance(a, torch.fx.Node) and isinstance(infos.get(a), TInfo)}
    if len(dts) != 1 or (td := dts.pop()) not in HALF:
        return args
    return [_round_number(a, td) if i < 2 else a for i, a in enumerate(args)]


def _round_number(a: Any, td: torch.dtype) -> Any:
    """Python number ``a`` as eager's half kernels see it: rounded to ``td`` (a number
    past float's range, which PyTorch itself refuses, is left for the op to report)."""
    if not isinstance(a, (int, float)) or isinstance(a, bool):
        return a
    try:
        return float(torch.tensor(float(a), dtype=td))
    except OverflowError:
        return a


def _rounded(result: Any, out: Any) -> Any:
    """A translation's result with each 16-bit float tensor rounded to its dtype."""
    if isinstance(result, tuple):
        return tuple(_rounded(r, o) for r, o in zip(result, out, strict=True))
    if isinstance(result, Var) and isinstance(out, TInfo) and out.dtype in HALF:
        return round_half(result, out.dtype)
    return result


def _carrier(td: torch.dtype) -> torch.dtype:
    return torch.float32 if td is torch.bool else torch.float64 if td in INT_DTYPES else td


def _in_place_layout(spec: _Input) -> tuple[torch.dtype, tuple[int, ...], tuple[int, ...]] | None:
    """(dtype, shape, strides) a tensor must have for a program to read its memory as
    it is; None for inputs that always go through :func:`_host_array` (converted)."""
    if spec.convert:
        return None
    strides = contiguous_strides(spec.shape)
    if spec.order is None:
        return TORCH_OF[spec.isa], spec.shape, strides
    # A permuted contiguous tensor: axis order[i] of the tensor is axis i of the program.
    shape, st = [0] * len(spec.order), [0] * len(spec.order)
    for i, d in enumerate(spec.order):
        shape[d], st[d] = spec.shape[i], strides[i]
    return TORCH_OF[spec.isa], tuple(shape), tuple(st)


def _packer(ex: Executor, compiled: Any, in_specs: list[Any], r: _Region
            ) -> PackedOperands | None:
    """Packed copies for the program's GEMMs whose B is a graph input read in place, not
    one the graph updates (its version moves every call), or None where there are none."""
    updated = {dst for dst, _ in r.updates.values()}
    nodes = [s.node if s.node not in updated else None for s in in_specs]
    layouts = [_in_place_layout(s) for s in in_specs]
    sites = ex.backend.pack_sites(compiled)
    if not any(nodes[s.input] is not None and layouts[s.input] is not None for s in sites):
        return None
    return PackedOperands(ex.backend, compiled, sites, nodes, layouts)


def _host_allocator(shape: tuple[int, ...], dtype: torch.dtype) -> Callable[[], torch.Tensor]:
    """A maker of empty contiguous CPU tensors of ``shape`` and ``dtype``.

    ``torch.empty(shape, dtype=...)`` spends 3-4.5 us parsing its tuple and keyword,
    ``torch.empty_like`` of a template 1.1-1.5 (Zen 4, torch 2.13): the README demo's
    forward graph's five allocations were 28 of the 52 us from its call to its
    program's start (docs/perf.md, session 29). The template is one element expanded
    to ``shape`` (strides 0), so it costs no memory, and ``contiguous_format`` makes
    the new tensor dense.
    """
    template = torch.empty((), dtype=dtype).expand(shape)
    return functools.partial(torch.empty_like, template, memory_format=torch.contiguous_format)


def _region_runner(r: _Region, ex: Executor, blas_threads: Any = "auto",
                   pack: bool = False) -> Callable[[dict[torch.fx.Node, Any]], None]:
    """``pack``: GEMMs may read packed copies of constant weights (inference graphs,
    ``hologram_torch.packed_weights``)."""
    assert r.program is not None
    program = r.program
    cap = _blas_threads_for(program, blas_threads)
    guard = _BlasThreads(cap) if cap is not None else None
    compiled = ex.compile(program)
    in_specs = list(r.inputs)
    # Derived inputs: computed from their source's tensor (kept while it is unchanged)
    # and put in the env under their key before the program reads them.
    derived = [(s.node, s.derived_from, DerivedInput(
        ex, s.derive, functools.partial(_host_array, spec=_Input(
            s.derived_from, *s.derive.inputs[0]))))
        for s in in_specs if s.derive is not None and s.derived_from is not None]
    seeds = [s.node for s in in_specs if s.seed]
    # Bool results leave a program as f32 and integer ones as f64 (the executor's
    # dtypes); PyTorch converts them back, exactly.
    outs = [(n, r.layouts[k].stored_shape if k in r.layouts else info.shape, info.dtype,
             _carrier(info.dtype)) for k, (n, _, info) in enumerate(r.outputs)]
    # Outputs handed out in their traced layout: (index, node, layout, dtype).
    strided = [(k, outs[k][0], lay, outs[k][2]) for k, lay in sorted(r.layouts.items())]
    plain = [(k, n, td, carrier) for k, (n, _, td, carrier) in enumerate(outs)
             if k not in r.layouts]
    nones = list(r.none_outputs)
    out_isa = [d for d, _ in program.output_specs]  # the carriers' ISA dtypes
    # A cuda executor launches on PyTorch's current stream when the tensors are CUDA
    # tensors (streams.py); host backends have no streams.
    on_cuda = ex.backend.device_type == "cuda"
    direct = ex.backend.pointer_launcher(compiled)
    # Outputs written straight into the graph input they update (pointer launches only:
    # the array path keeps its no-aliasing check).
    into = {k: dst for k, (dst, j) in r.updates.items()
            if direct is not None and (j is None or ex.backend.may_overwrite(compiled, j, k))}
    r.in_place = sorted(into)
    if direct is not None:
        # The per-call path of every training step: tensors' addresses go straight into
        # the program's pointer table. A tensor is read in place when it has the
        # planned dtype, shape and strides (dynamo's guards make that the rule);
        # anything else is viewed or copied by _host_array, as on the general path.
        # (node, spec, dtype, shape, strides); dtype None: always through _host_array
        reads = [(s.node, s, *(_in_place_layout(s) or (None, None, None))) for s in in_specs]
        packer = _packer(ex, compiled, in_specs, r) if pack else None

        def launch(env: dict[torch.fx.Node, Any], results: list[torch.Tensor]) -> None:
            pointers: list[int] = []
            copies: list[np.ndarray] = []  # alive until the program has run
            copied: list[int] = []  # the inputs not read in place
            for i, (node, spec, dtype, shape, strides) in enumerate(reads):
                t = env[node]
                if (t.dtype is dtype and t.is_cpu and t.shape == shape
                        and t.stride() == strides):
                    pointers.append(t.data_ptr())
                else:
                    a = _host_array(t, spec)
                    copies.append(a)
                    pointers.append(data_pointer(a))
                    copied.append(i)
            for k, j, dst in into_read:
                results[k] = env[dst] if j not in copied else new_result[k]()
            if packer is None:
                pointers.extend(t.data_ptr() for t in results)
                direct(pointers)
                return
            packed, keep = packer.addresses(env, pointers)  # keep: alive through the call
            pointers.extend(t.data_ptr() for t in results)
            direct(pointers, packed)
    else:
        packer = _packer(ex, compiled, in_specs, r) if pack else None

        def launch(env: dict[torch.fx.Node, Any], results: list[torch.Tensor]) -> None:
            arrays = [_host_array(env[s.node], s) for s in in_specs]
            # Straight to the backend: Executor.launch would re-check that outputs do
            # not alias inputs, which cannot happen (we just allocated them), and that
            # check cost as much as a small kernel. No program here uses Φ addressing,
            # so no boundary arena is passed.
            if packer is None:
                ex.backend.launch(compiled, arrays, [host_numpy(t) for t in results])
                return
            # a site's copy is used only where its array is the tensor's own memory
            packed, keep = packer.addresses(env, [data_pointer(a) for a in arrays])
            ex.backend.launch(compiled, arrays, [host_numpy(t) for t in results],
                              packed=packed)

    new_result = [_host_allocator(shape, carrier) for _, shape, _, carrier in outs]
    # Outputs written into a graph input the program reads (output, input index, the
    # input's node): where the launch read that input in place, the tensor has passed
    # every check result() makes (dtype, device, shape, contiguous strides: the update
    # was planned only where they agree), so the launch makes it the output without
    # checking it again (an optimizer step's twelve; docs/perf.md, session 30).
    into_read = [(k, j, into[k]) for k, (_, j) in sorted(r.updates.items())
                 if k in into and j is not None]
    in_launch = {k for k, _, _ in into_read}

    def result(env: dict[torch.fx.Node, Any], k: int, shape: tuple[int, ...],
               carrier: torch.dtype) -> torch.Tensor | None:
        if k in in_launch:
            return None  # launch's to decide, once it has read the input
        dst = into.get(k)
        if dst is not None:
            t = env[dst]
            if t.dtype is carrier and t.is_cpu and t.shape == shape and t.is_contiguous():
                return t
        return new_result[k]()

    def launch_on_device(env: dict[torch.fx.Node, Any], results: list[Any]) -> None:
        """CUDA tensors (cuda_tensors.py): inputs and outputs shared with the kernels
        through DLPack, nothing staged through the host."""
        arrays = [cuda_tensors.device_array(env[s.node], ex, s.shape, s.isa, s.order,
                                            s.convert) for s in in_specs]
        windows = [cuda_tensors.device_array(t, ex, shape, isa)
                   for t, (_, shape, _, _), isa in zip(results, outs, out_isa, strict=True)]
        ex.backend.launch(compiled, arrays, windows)

    # In-place updates (copy_(input, output k)) finished here, not by steps of their
    # own: the graph input itself when the output was written into it, else a copy
    # into it (its layout changed since the trace). An optimizer step's twelve update
    # steps cost it ~20 us a call in Python (docs/perf.md, session 30); no other step
    # reads either tensor (_Plan._plan_updates), so finishing them early is the same.
    finish = [(k, into[k], r.update_nodes[k]) for k in r.in_place]

    def hand_out(env: dict[torch.fx.Node, Any], results: list[torch.Tensor]) -> None:
        for k, node, td, carrier in plain:
            t = results[k]
            env[node] = t if td is carrier else t.to(td)
        for k, node, layout, td in strided:
            env[node] = layout.hand_out(results[k], td)
        for k, dst, node in finish:
            d, t = env[dst], results[k]
            if t is not d:
                d.copy_(t)
            env[node] = d

    def inputs_ready(env: dict[torch.fx.Node, Any]) -> None:
        for n in nones:
            env[n] = None
        for key, source, d in derived:
            env[key] = d.value(env[source])
        for key in seeds:
            env[key] = draw_seed()

    def host_results(env: dict[torch.fx.Node, Any]) -> list[torch.Tensor]:
        if into:
            return [result(env, k, shape, carrier)
                    for k, (_, shape, _, carrier) in enumerate(outs)]
        return [new() for new in new_result]

    def host_launch(env: dict[torch.fx.Node, Any], results: list[torch.Tensor]) -> None:
        if guard is None:
            launch(env, results)
        else:
            with guard:
                launch(env, results)

    def run_on_host(env: dict[torch.fx.Node, Any]) -> None:
        """Every call of a host executor: the per-step path, kept to what it must do."""
        inputs_ready(env)
        results = host_results(env)
        ex._check_open()  # what Executor.use_stream checks (host backends have no streams)
        host_launch(env, results)
        hand_out(env, results)

    def run_on_cuda(env: dict[torch.fx.Node, Any]) -> None:
        inputs_ready(env)
        device = cuda_tensors.cuda_device(env[s.node] for s in in_specs)
        if device is not None:
            for key in seeds:  # drawn on the host: the program reads it on the device
                env[key] = env[key].to(device)
        if device is not None:  # written by the kernels through DLPack, never in place
            results = [cuda_tensors.empty(shape, carrier, device)
                       for _, shape, _, carrier in outs]
        else:
            results = host_results(env)
        with ex.use_stream(launch_stream(env[s.node] for s in in_specs)):
            if device is not None:
                launch_on_device(env, results)
            else:
                host_launch(env, results)
        hand_out(env, results)

    return run_on_cuda if on_cuda else run_on_host


# --------------------------------------------------------------------------------------
# The compiled graph and the dynamo backend.
# --------------------------------------------------------------------------------------
class HologramGraph:
    """The callable AOT autograd gets back for one graph (boxed calling convention)."""

    def __init__(self, gm: torch.fx.GraphModule, kind: str, executor: Executor,
                 blas_threads: Any = "auto", pack_weights: bool = True) -> None:
        # An instance attribute, so dynamo's disable() wrapper (functools.wraps copies
        # __dict__) still tells AOT autograd that we take boxed arguments.
        self._boxed_call = True
        self.gm = gm
        self.kind = kind
        self.executor = executor
        self.blas_threads = blas_threads
        self.pack_weights = pack_weights
        self._plans: dict[tuple, _Plan] = {}
        self._lock = threading.Lock()
        infos = _infos_from_meta(gm)
        self._static = self._new_plan(infos) if infos is not None else None

    def _new_plan(self, infos: dict[torch.fx.Node, Any], ran_in_pytorch: bool = False
                  ) -> _Plan:
        plan = _Plan(self.gm, infos, self.executor, self.kind, self.blas_threads,
                     self.pack_weights)
        plan.summary.ran_in_pytorch = ran_in_pytorch
        with _COLLECT_LOCK:
            for sink in _COLLECTORS:
                sink.append(plan.summary)
        return plan

    @property
    def plans(self) -> list[_Plan]:
        """Every plan built so far (one, or one per shape signature when shapes vary)."""
        return ([self._static] if self._static is not None else []) + list(self._plans.values())

    def __call__(self, *call_args: Any) -> Any:
        # Boxed (one list, which we may clear to free inputs early) as AOT autograd
        # prefers; its backward wrapper drops the _boxed_call mark and calls unboxed.
        if len(call_args) == 1 and isinstance(call_args[0], list):
            args = call_args[0]
        else:
            args = list(call_args)
        if self._static is not None:
            return self._static.run(args)
        key = _signature(args)
        plan = self._plans.get(key)
        if plan is not None:
            return plan.run(args)
        # New shapes under a dynamic graph: run eagerly once to learn them, then plan.
        rec = _Recorder(self.gm)
        out = rec.run(*args)
        args.clear()
        with self._lock:
            if key not in self._plans:
                self._plans[key] = self._new_plan(rec.infos, ran_in_pytorch=True)
        return out


def _graph_compiler(kind: str, executor: Executor, blas_threads: Any,
                    pack_weights: bool = True) -> Callable[..., HologramGraph]:
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> HologramGraph:
        return HologramGraph(gm, kind, executor, blas_threads, pack_weights)

    return compile_graph


#: Dynamo-graph call targets whose programs call the fused attention driver.
_ATTENTION_TARGETS = frozenset({"scaled_dot_product_attention", "softmax", "_softmax"})


def hologram_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                     options: dict[str, Any] | None = None, **_: Any) -> Callable[..., Any]:
    """The dynamo backend: AOT autograd around graphs translated to Atlas ISA programs.

    ``options`` (from ``torch.compile(..., options=...)``): ``executor`` is an
    :class:`hologram.Executor` or a backend name for the shared executor
    (default ``"cpu"``); ``blas_threads`` caps NumPy's BLAS threads while a
    program runs: ``"auto"`` (default: one thread for programs whose GEMMs are
    all small, see :class:`_BlasThreads`), an int, or None to leave BLAS alone.
    ``autograd``: ``"direct"`` (default) runs a training graph that mutates nothing
    and has static shapes under one small autograd.Function
    (:mod:`hologram_torch.direct_autograd`), other graphs through AOT autograd's
    runtime; ``"aot"`` sends every graph through AOT autograd. ``pack_weights``
    (default True): inference graphs' GEMMs read packed copies of weights that stay
    unchanged between calls, where the BLAS can pack (MKL); see
    :mod:`hologram_torch.packed_weights` for when a copy is remade, and its limit
    (writes that bypass PyTorch's version counter, such as through ``.data``).
    """
    from torch._dynamo.backends.common import aot_autograd

    opts = dict(options or {})
    ex = opts.pop("executor", "cpu")
    blas = opts.pop("blas_threads", "auto")
    mode = opts.pop("autograd", "direct")
    pack = opts.pop("pack_weights", True)
    if opts:
        raise TypeError(f"hologram backend: unknown options {sorted(opts)}")
    if not (blas is None or blas == "auto" or (isinstance(blas, int) and blas > 0)):
        raise ValueError(f"hologram backend: blas_threads must be 'auto', None or a positive "
                         f"int, got {blas!r}")
    if not isinstance(pack, bool):
        raise ValueError(f"hologram backend: pack_weights must be True or False, got {pack!r}")
    if mode not in ("direct", "aot"):
        raise ValueError(f"hologram backend: autograd must be 'direct' or 'aot', got {mode!r}")
    executor = ex if isinstance(ex, Executor) else default_executor(str(ex))
    autograd_decompositions.apply(gm)  # (before AOT autograd differentiates the graph)
    # Runtime libraries build on another core while AOT autograd traces (a cold cache).
    executor.backend.prewarm(
        attention=any(getattr(n.target, "__name__", "") in _ATTENTION_TARGETS
                      for n in gm.graph.nodes),
        bf16=any(isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16
                 for x in example_inputs))
    fw = _graph_compiler("forward", executor, blas)
    bw = _graph_compiler("backward", executor, blas)
    decomps = decompositions()
    if mode == "direct":
        direct = compile_training(gm, example_inputs, fw, bw, decomps)
        if direct is not None:
            return direct
    backend = aot_autograd(
        # In-place updates of inputs (an optimizer step) stay in inference graphs as
        # copy_ nodes, which the plan may turn into stores into the input itself.
        keep_inference_input_mutations=True,
        fw_compiler=fw,
        bw_compiler=bw,
        inference_compiler=_graph_compiler("inference", executor, blas, pack),
        decompositions=decomps,
    )
    return backend(gm, example_inputs)


def register() -> None:
    """Make ``backend="hologram"`` resolve to :func:`hologram_backend`.

    Registration is skipped when the name is already known to dynamo: either this
    function ran, or the ``torch_dynamo_backends`` entry point was discovered, in
    which case dynamo loads this module through it (registering here as well would
    make dynamo's own registration fail as a duplicate).
    """
    from torch._dynamo.backends import registry

    if BACKEND_NAME in getattr(registry, "_COMPILER_FNS", {}):
        return
    if getattr(registry, "_BACKENDS", {}).get(BACKEND_NAME) is not None:
        return
    registry.register_backend(hologram_backend, name=BACKEND_NAME)


register()
