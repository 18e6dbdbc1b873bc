"""PyTorch's OpInfo samples through ``backend="hologram"``: a fixed, fast subset of the
sweep (``tests/opinfo_sweep.py``; the full sweep is ``tools/opinfo_sweep.py`` and its
summary ``docs/opinfo.md``).

The subset is the ops the models use and the element-wise and reduction families the
backend translates, a few samples each, every sample compiled forward and backward in
a worker subprocess and compared with eager. Each sample must match (or fail under
``backend="aot_eager"`` as well, which puts the difference in PyTorch's tracing), no
worker may crash, and the ops in :data:`WHOLLY_IN_HOLOGRAM` must run without a single
compute op left to PyTorch: a translation that starts raising ``Unsupported`` fails
here instead of quietly falling back.
"""

from __future__ import annotations

import signal

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch.testing._internal's import needs it

from . import opinfo_sweep as sweep  # noqa: E402

SAMPLES = 2  # per op

#: Ops whose samples must run wholly inside hologram programs (forward and backward).
WHOLLY_IN_HOLOGRAM = (
    # arithmetic and math
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "div.trunc_rounding",
    "floor_divide", "fmod", "remainder", "pow", "neg", "abs", "exp", "log", "sqrt", "rsqrt",
    "reciprocal", "tanh", "sigmoid", "erf", "sin", "cos", "sign", "floor", "ceil", "trunc",
    "round", "round.decimals_3", "frac", "log1p", "expm1", "xlogy", "logit", "logaddexp",
    "asin", "atan", "sinh", "acosh", "log2", "exp2", "erfc", "atan2", "hypot", "copysign",
    "signbit", "fmax", "fmin",
    "maximum", "minimum", "clamp", "clamp_min", "clamp_max", "where", "masked_fill",
    "nan_to_num", "heaviside",
    # comparisons, logic, IEEE classes
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not",
    "logical_xor", "isnan", "isinf", "isfinite", "isposinf", "isneginf",
    # masks, padding, creation and re-indexing
    "tril", "triu", "constant_pad_nd", "nn.functional.pad.constant", "linspace", "logspace",
    "eye", "repeat", "roll", "stack", "diagonal_copy", "diag_embed", "diagonal_scatter",
    # reductions
    "sum", "mean", "prod", "amax", "amin", "aminmax", "argmax", "argmin",
    "max.reduction_with_dim", "min.reduction_with_dim", "max.reduction_no_dim",
    "min.reduction_no_dim", "any", "all", "count_nonzero", "nansum", "nanmean", "var", "std",
    "var_mean", "logsumexp", "linalg.vector_norm", "dist",
    # activations
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu",
    "nn.functional.softplus", "nn.functional.mish", "nn.functional.hardswish",
    "nn.functional.hardsigmoid", "nn.functional.relu6", "nn.functional.hardtanh",
    "nn.functional.leaky_relu", "nn.functional.elu", "nn.functional.celu",
    "nn.functional.logsigmoid", "nn.functional.glu", "nn.functional.prelu",
    # the models' layers and losses
    "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.group_norm",
    "nn.functional.instance_norm", "nn.functional.linear", "matmul",
    "mm", "bmm", "addmm", "mv", "dot", "cat", "nn.functional.mse_loss",
    "nn.functional.cross_entropy",
    "nn.functional.binary_cross_entropy_with_logits", "nn.functional.binary_cross_entropy",
    # scatter reductions (SCATTER_ADD/MUL/MAX/MIN), sorting (ARGSORT), special functions
    # (LGAMMA, DIGAMMA, ZETA), and ops whose decompositions or rows are views and indexing
    "scatter_reduce.sum", "scatter_reduce.prod", "scatter_reduce.mean", "scatter_reduce.amax",
    "scatter_reduce.amin", "index_reduce.prod", "index_reduce.amin", "put", "take",
    "sort", "argsort", "topk", "kthvalue", "median", "nanmedian", "quantile",
    "lgamma", "digamma", "polygamma.polygamma_n_1", "polygamma.polygamma_n_3",
    "mvlgamma.mvlgamma_p_3", "special.zeta",
    "unsqueeze_copy", "transpose_copy", "split_with_sizes_copy", "zero_",
    "nn.functional.pixel_shuffle", "nn.functional.channel_shuffle", "ldexp", "block_diag",
    "linalg.cross", "renorm", "index_copy", "unfold_copy", "nn.functional.pad.reflect",
    "nn.functional.pad.replicate", "nn.functional.unfold", "_unsafe_masked_index",
    "as_strided_scatter", "searchsorted", "bucketize", "histc", "nonzero_static", "cdist",
    "nn.functional.pdist", "nn.functional.bilinear", "addbmm", "_segment_reduce.lengths",
    "_segment_reduce.offsets",
    # convolution and pools (taps, GATHERed columns and GEMM; forward and backward)
    "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d",
    "nn.functional.conv_transpose1d", "nn.functional.conv_transpose2d",
    "nn.functional.conv_transpose3d", "nn.functional.avg_pool1d",
    "nn.functional.avg_pool2d", "nn.functional.max_pool1d", "nn.functional.max_pool2d",
    "nn.functional.adaptive_avg_pool1d", "nn.functional.adaptive_avg_pool2d",
    "nn.functional.adaptive_max_pool1d", "nn.functional.adaptive_max_pool2d",
    "nn.functional.adaptive_max_pool3d", "nn.functional.max_pool3d",
    "nn.functional.adaptive_avg_pool3d",
    "nn.functional.max_unpool1d", "nn.functional.max_unpool2d", "nn.functional.max_unpool3d",
    # rewritten above autograd (hologram_torch/autograd_decompositions.py)
    "nn.functional.embedding_bag",
)
#: Ops in the subset that may still run partly in PyTorch (they must match all the same).
#: The interpolations and quantile compute integer indices from floats (the sweep found
#: them reading past a row when a float-to-int64 conversion kept the fraction).
OTHERS = ("masked.argmax", "cumsum", "linalg.cholesky", "nn.functional.interpolate.nearest",
          "nn.functional.interpolate.bilinear", "long", "nn.functional.batch_norm",
          "as_strided", "empty", "histogram",
          # its forward in hologram (PyTorch's decomposition: GATHERed corners), its
          # backward (grid_sampler_2d_backward) in PyTorch
          "nn.functional.grid_sample")
SUBSET = WHOLLY_IN_HOLOGRAM + OTHERS


@pytest.fixture(scope="module")
def results() -> dict[str, list[sweep.SampleResult]]:
    counts = sweep.sample_counts(SUBSET, SAMPLES)
    out: dict[str, list[sweep.SampleResult]] = {k: [] for k in SUBSET}
    for r in sweep.Pool(workers=2, timeout=240).run(sweep.tasks_for(counts, SAMPLES)):
        out[r.op].append(r)
    return out


#: Ops whose 16-bit float samples must match eager and run wholly inside hologram
#: programs: values carried as f32, every ATen op's result rounded to the dtype
#: (``hologram_torch.fx_info.HALF``); ``tools/opinfo_sweep.py --dtype`` runs them all.
HALF_WHOLLY = {
    "bfloat16": (
        "add", "sub", "mul", "div.no_rounding_mode", "fmod", "remainder", "pow", "exp",
        "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "eq", "gt", "where", "clamp",
        "masked_fill", "sum", "mean", "amax", "argmax", "var", "logsumexp", "softmax",
        "log_softmax", "nn.functional.layer_norm", "nn.functional.group_norm",
        "nn.functional.linear", "matmul", "bmm", "addmm", "cat", "nn.functional.cross_entropy",
        "nn.functional.mse_loss", "nn.functional.gelu", "nn.functional.silu",
        "nn.functional.relu", "nn.functional.conv2d", "nn.functional.max_pool2d",
        "nn.functional.avg_pool2d", "nn.functional.embedding", "gather", "index_select",
        "scatter_reduce.sum", "topk"),
    "float16": ("add", "mul", "div.no_rounding_mode", "gt", "exp", "softmax",
                "nn.functional.layer_norm", "nn.functional.linear", "bmm", "sum",
                "nn.functional.gelu", "nn.functional.conv2d"),
}


@pytest.fixture(scope="module")
def half_results() -> dict[tuple[str, str], list[sweep.SampleResult]]:
    out: dict[tuple[str, str], list[sweep.SampleResult]] = {}
    for dtype, ops in HALF_WHOLLY.items():
        counts = sweep.sample_counts(ops, SAMPLES, dtype)
        for op in ops:
            out[dtype, op] = []
        pool = sweep.Pool(workers=2, timeout=240, dtype=dtype)
        for r in pool.run(sweep.tasks_for(counts, SAMPLES)):
            out[dtype, r.op].append(r)
    return out


@pytest.mark.parametrize(("dtype", "op"), [(d, o) for d, ops in HALF_WHOLLY.items()
                                           for o in ops])
def test_half_samples_match_eager_wholly_in_hologram(half_results, dtype, op):
    rs = half_results[dtype, op]
    assert rs, f"{op} ({dtype}): no samples ran"
    for r in rs:
        assert r.status in ("match", "skip"), (f"{op} ({dtype}) sample {r.index}: "
                                               f"{r.status} in {r.phase}: {r.detail}")
        if r.status == "match":
            assert r.route == "hologram", (f"{op} ({dtype}) sample {r.index} ran "
                                           f"{r.route}: {r.fallbacks}")
    assert any(r.status == "match" for r in rs), f"{op} ({dtype}): no sample compared"


def test_ties_leave_the_order_of_equal_elements_unspecified():
    """An unstable sort's indices of tied elements are the implementation's choice: a
    sort sample whose input has ties and whose indices differ from eager's is skipped
    (``TIES_UNSPECIFIED``), one without ties is compared as any other."""
    import torch

    assert sweep._has_ties(torch.tensor([1.0, 2.0, 1.0]))
    assert not sweep._has_ties(torch.tensor([1.0, 2.0, 3.0]))
    assert not sweep._has_ties(torch.tensor(1.0))
    assert {"sort", "argsort", "topk"} <= sweep.TIES_UNSPECIFIED


def test_the_subset_names_opinfos():
    assert not set(SUBSET) - set(sweep.opinfos()), "subset ops OpInfo does not have"
    for dtype, ops in HALF_WHOLLY.items():
        assert not set(ops) - set(sweep.opinfos(dtype)), f"no {dtype} OpInfo: {ops}"


@pytest.mark.parametrize("op", SUBSET)
def test_samples_match_eager(results, op):
    rs = results[op]
    assert rs, f"{op}: no samples ran"
    for r in rs:
        assert r.status != "crash", f"{op} sample {r.index} crashed: {r.detail}"
        if r.status in ("mismatch", "error"):
            assert r.aot_eager_fails, (f"{op} sample {r.index}: {r.status} in {r.phase} "
                                       f"under hologram only: {r.detail}")
    assert any(r.status == "match" for r in rs), f"{op}: no sample compared"


@pytest.mark.parametrize("op", WHOLLY_IN_HOLOGRAM)
def test_claimed_ops_run_wholly_in_hologram(results, op):
    for r in results[op]:
        if r.status == "skip":
            continue
        assert r.route == "hologram", (f"{op} sample {r.index} ran {r.route}: "
                                       f"{r.fallbacks}")


def test_backward_is_compared_where_the_op_has_one(results):
    # a harness that silently stopped comparing gradients would pass everything above
    assert all(r.backward for r in results["nn.functional.silu"] if r.status == "match")
    assert not any(r.backward for r in results["argmax"])


def test_a_dying_or_hanging_worker_is_a_crash_and_is_replaced():
    tasks = [sweep.Task("__segfault__", 0, 1), sweep.Task("__exit__", 0, 1),
             sweep.Task("__hang__", 0, 1), sweep.Task("abs", 0, 1)]
    rs = sweep.Pool(workers=1, timeout=30).run(tasks)
    by_op = {r.op: r for r in rs}
    assert [r.op for r in rs] == [t.op for t in tasks]
    assert by_op["__segfault__"].status == "crash"
    assert signal.Signals.SIGSEGV.name in by_op["__segfault__"].detail
    assert by_op["__exit__"].status == "crash" and "status 3" in by_op["__exit__"].detail
    assert by_op["__hang__"].status == "crash" and "timed out" in by_op["__hang__"].detail
    assert by_op["abs"].status == "match"  # the pool went on with a fresh worker


def test_summary_counts_statuses_routes_and_aot_eager():
    rs = [sweep.SampleResult("a", 0, "match", route="hologram"),
          sweep.SampleResult("a", 1, "match", route="partly",
                             fallbacks=["aten.x: no hologram translation"]),
          sweep.SampleResult("b", 0, "mismatch", route="hologram", phase="backward",
                             aot_eager_fails=True, detail="off | by one"),
          sweep.SampleResult("b", 1, "crash", detail="worker killed by signal SIGSEGV"),
          sweep.SampleResult("c", 0, "skip", detail="eager fails")]
    text = sweep.summary_markdown(rs, "python tools/opinfo_sweep.py")
    assert "| samples | 5 | |" in text
    assert "| match | 2 | 50.00% of compared |" in text
    assert "| ... of which aot_eager fails too | 1 | |" in text
    assert "| crash | 1 | |" in text
    assert "| wholly in hologram | 2 | 50.00% of compared" in text
    assert "| aten.x | 1 | no hologram translation |" in text
    assert "off \\| by one" in text  # table cells escape pipes
    assert "| b | 2 | 0 | 1 | 0 | 1 | 0 | 1 | 0 | 0 | 0 |" in text


class _Op:
    """The few OpInfo attributes run_sample reads, around a plain function."""

    def __init__(self, name: str, fn) -> None:
        self.name, self.variant_test_name, self.op = name, "", fn
        self.supports_autograd, self.decorators = True, ()


class _Sample:
    def __init__(self, x) -> None:
        self.input, self.args, self.kwargs, self.output_process_fn_grad = x, (), {}, None


def _route_of(fn):
    import torch

    x = torch.linspace(-2.0, 3.0, 12).reshape(3, 4).requires_grad_(True)
    return sweep.run_sample(_Op("f", fn), _Sample(x), 0, check_aot_eager=False)


def test_graph_breaks_count_by_what_ran_between_the_graphs():
    """A sample split by graph breaks is wholly in hologram when every graph is a program
    and PyTorch ran nothing between them but item(); an op run eagerly between graphs
    (nonzero: a data-dependent shape) makes it partly, and the op is named."""
    import torch

    def item_break(x):
        y = x.sin()
        return y * 2.0 + y.sum().item()

    def eager_between(x):
        y = x.sin()
        n = torch.nonzero(y > 0).shape[0]
        return y.cos() * float(n)

    r = _route_of(item_break)
    assert r.status == "match" and r.route == "hologram", (r.route, r.fallbacks)
    assert r.programs >= 2  # forward graphs on each side of the break, and backward
    r = _route_of(eager_between)
    assert r.status == "match" and r.route == "partly"
    assert any(f.startswith("aten.nonzero: ") and "eager" in f for f in r.fallbacks), \
        r.fallbacks
