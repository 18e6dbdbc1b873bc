"""``torch.nn.functional``-style ops computed by hologram programs, with autograd.

Each op is a ``torch.library`` custom op in the ``hologram`` namespace
(``torch.ops.hologram.gelu`` ...) with a fake implementation, so torch.compile
traces it without a graph break, and a registered backward whose math is itself
a hologram program (a custom op too), so training runs hologram end to end.

The public functions take torch's arguments (same names, defaults, reductions,
legacy ``size_average``/``reduce``) plus an optional hologram ``Executor``,
either first (``add(exec, a, b)``, the seeds' convention) or as ``executor=``
(an Executor or a backend name, 'cpu' or 'reference'). The executor selects
the backend; torch allocates every result.

Shapes are normalised before they reach a program (element-wise ops run on flat
views, softmax on (outer, n, inner), layer norm on (rows, features), losses on
(N, C, rest)), so tensors of different shapes share one compiled kernel.
"""

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from hologram.executor import Executor
from hologram.isa.builder import Var, const
from hologram.ops import composites as C

from . import _ops
from .utils import backend_name

__all__ = [
    "add", "binary_cross_entropy", "binary_cross_entropy_with_logits", "cross_entropy",
    "gelu", "layer_norm", "linear", "log_softmax", "mse_loss", "mul", "relu", "sigmoid",
    "softmax", "sub", "tanh",
]

_REDUCTIONS = ("none", "mean", "sum")
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_GELU_KAPPA = 0.044715


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
def _takes_executor(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """Accept the seeds' leading executor (``op(exec, x, ...)``) as ``executor=``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Tensor:
        if args and isinstance(args[0], Executor):
            if kwargs.get("executor") is not None:
                raise TypeError(f"{fn.__name__}: executor given twice")
            kwargs["executor"] = args[0]
            args = args[1:]
        return fn(*args, **kwargs)

    return wrapper


def _full(like: Var, value: float) -> Var:
    """A constant array shaped like ``like`` (SEL needs at least one array branch)."""
    return Var(const(value, like.dtype, like.shape))


def _prod(shape: Sequence[int]) -> int:
    r = 1
    for s in shape:  # a loop, not math.prod over a generator: torch.compile traces it
        r = r * s
    return r


def _flat(t: Tensor) -> Tensor:
    return t.reshape(-1)


def _ew(key: tuple, fn: Callable[..., Any], tensors: Sequence[Tensor], backend: str,
        shape: Sequence[int]) -> list[Tensor]:
    """Run an element-wise program on flat views of same-shaped tensors."""
    outs = _ops.run(key, fn, [_flat(t) for t in tensors], backend)
    return [o.view(tuple(shape)) for o in outs]


def _none() -> Tensor:
    """The placeholder a backward op returns for a gradient nobody asked for."""
    return torch.empty(0)


def _check_float(t: Tensor, name: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    _ops.check_device(t, name)
    _ops.check_dtype(t, name)


def _combine(higher: torch.dtype | None, lower: torch.dtype | None) -> torch.dtype | None:
    """torch's combine_categories: a lower-priority operand only wins a higher category."""
    if higher is None:
        return lower
    if lower is None or higher.is_floating_point:
        return higher
    if higher == torch.bool or lower.is_floating_point:
        return torch.promote_types(higher, lower)
    return higher


def _result_type(*operands: Any) -> torch.dtype:
    """``torch.result_type`` written with dtype arithmetic only.

    torch.compile cannot trace torch.result_type (it returns a dtype computed from
    tensors), but it folds promote_types over constant dtypes. Priority as torch:
    tensors with dims, then 0-d tensors, then Python numbers (float -> default dtype).
    """
    slots: list[torch.dtype | None] = [None, None, None]
    for x in operands:
        if isinstance(x, Tensor):
            i, d = (0 if x.dim() else 1), x.dtype
        elif isinstance(x, bool):
            i, d = 2, torch.bool
        elif isinstance(x, int):
            i, d = 2, torch.int64
        elif isinstance(x, float):
            i, d = 2, torch.get_default_dtype()
        else:
            raise TypeError(f"expected a tensor or a number, got {type(x).__name__}")
        slots[i] = d if slots[i] is None else torch.promote_types(slots[i], d)
    out = _combine(slots[0], _combine(slots[1], slots[2]))
    assert out is not None
    return out


def _promote(a: Any, b: Any, what: str) -> tuple[Tensor, Tensor]:
    """Torch's type promotion for two operands (numbers become 0-d tensors)."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise TypeError(f"{what}: at least one operand must be a tensor")
    dt = _result_type(a, b)
    if dt not in _ops.TORCH_TO_ISA:
        raise TypeError(f"hologram_torch.{what}: result dtype {dt} is not supported "
                        "(float32 and float64 are)")
    ref = a if isinstance(a, Tensor) else b
    a = a.to(dt) if isinstance(a, Tensor) else torch.tensor(a, dtype=dt, device=ref.device)
    b = b.to(dt) if isinstance(b, Tensor) else torch.tensor(b, dtype=dt, device=ref.device)
    return a, b


def _reduction(size_average: bool | None, reduce: bool | None, reduction: str) -> str:
    if size_average is not None or reduce is not None:
        from torch.nn import _reduction as legacy

        reduction = legacy.legacy_get_string(size_average, reduce)
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction")
    return reduction


def _no_grad_for(name: str, t: Tensor | None) -> None:
    """Gradients for loss weights are not implemented (torch's nll_loss has none either)."""
    if t is not None and t.requires_grad and torch.is_grad_enabled():
        raise NotImplementedError(f"hologram_torch: the gradient with respect to {name} is not "
                                  "implemented; detach it or use torch's op")


def _reduce_axes(out_shape: Sequence[int], shape: Sequence[int]) -> tuple[int, ...]:
    """Axes of ``out_shape`` to sum so the result broadcasts back as ``shape``."""
    lead = len(out_shape) - len(shape)
    return tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and out_shape[lead + i] != 1)


def _sum_to(grad: Tensor, shape: Sequence[int], scale: float, backend: str) -> Tensor:
    """``scale * grad`` summed down to ``shape`` (the gradient of a broadcast)."""
    if tuple(grad.shape) == tuple(shape) and scale == 1.0:
        return grad
    return sum_to_op(grad, list(shape), scale, backend)


# --------------------------------------------------------------------------------------
# sum_to: gradients of broadcasting (used by the binary ops, linear's bias, losses)
# --------------------------------------------------------------------------------------
@torch.library.custom_op("hologram::sum_to", mutates_args=())
def sum_to_op(x: Tensor, shape: list[int], scale: float, backend: str) -> Tensor:
    """Sum ``x`` over the axes broadcasting added to ``shape``, times ``scale``."""
    shape_t = tuple(shape)
    axes = _reduce_axes(x.shape, shape_t)

    def fn(v: Var) -> Var:
        r = v.sum(axes, keepdims=True).reshape(shape_t) if axes else v.reshape(shape_t)
        return r * scale if scale != 1.0 else r

    if not axes:  # only a reshape (and a scale): the flat kernel serves every shape
        return _ops.run(("sum_to_flat", scale), lambda v: v * scale, [_flat(x)],
                        backend)[0].view(shape_t)
    return _ops.run(("sum_to", shape_t, scale), fn, [x], backend)[0]


@sum_to_op.register_fake
def _(x: Tensor, shape: list[int], scale: float, backend: str) -> Tensor:
    return x.new_empty(shape)


# --------------------------------------------------------------------------------------
# add, sub, mul
# --------------------------------------------------------------------------------------
def _binary_forward(name: str, fn: Callable[[Var, Var], Var], a: Tensor, b: Tensor,
                    key: tuple, backend: str) -> Tensor:
    shape = torch.broadcast_shapes(a.shape, b.shape)
    if a.shape == b.shape or b.dim() == 0 or a.dim() == 0:
        # Same shape, or a scalar operand: flat views give one kernel per size.
        fa = _flat(a) if a.dim() else a
        fb = _flat(b) if b.dim() else b
        return _ops.run((name + "_flat", *key), fn, [fa, fb], backend)[0].view(shape)
    return _ops.run((name, *key), fn, [a, b], backend)[0]


@torch.library.custom_op("hologram::add", mutates_args=())
def add_op(a: Tensor, b: Tensor, alpha: float, backend: str) -> Tensor:
    """``a + alpha * b`` with broadcasting."""
    return _binary_forward("add", lambda x, y: x + y * alpha if alpha != 1.0 else x + y,
                           a, b, (alpha,), backend)


@torch.library.custom_op("hologram::sub", mutates_args=())
def sub_op(a: Tensor, b: Tensor, alpha: float, backend: str) -> Tensor:
    """``a - alpha * b`` with broadcasting."""
    return _binary_forward("sub", lambda x, y: x - y * alpha if alpha != 1.0 else x - y,
                           a, b, (alpha,), backend)


@torch.library.custom_op("hologram::mul", mutates_args=())
def mul_op(a: Tensor, b: Tensor, backend: str) -> Tensor:
    """``a * b`` with broadcasting."""
    return _binary_forward("mul", lambda x, y: x * y, a, b, (), backend)


@torch.library.custom_op("hologram::mul_sum_to", mutates_args=())
def mul_sum_to_op(grad: Tensor, other: Tensor, shape: list[int], backend: str) -> Tensor:
    """``grad * other`` summed down to ``shape``: one operand's gradient of a product."""
    shape_t = tuple(shape)
    axes = _reduce_axes(grad.shape, shape_t)
    if not axes and tuple(other.shape) in (tuple(grad.shape), ()):
        fo = _flat(other) if other.dim() else other
        return _ops.run(("mul_sum_to_flat",), lambda g, o: g * o, [_flat(grad), fo],
                        backend)[0].view(shape_t)

    def fn(g: Var, o: Var) -> Var:
        p = g * o
        return p.sum(axes, keepdims=True).reshape(shape_t) if axes else p.reshape(shape_t)

    return _ops.run(("mul_sum_to", shape_t), fn, [grad, other], backend)[0]


@mul_sum_to_op.register_fake
def _(grad: Tensor, other: Tensor, shape: list[int], backend: str) -> Tensor:
    return grad.new_empty(shape)


def _binary_fake(a: Tensor, b: Tensor, *args: Any) -> Tensor:
    return a.new_empty(torch.broadcast_shapes(a.shape, b.shape))


add_op.register_fake(_binary_fake)
sub_op.register_fake(_binary_fake)
mul_op.register_fake(_binary_fake)


def _binary_setup(ctx: Any, inputs: tuple, output: Tensor) -> None:
    a, b = inputs[0], inputs[1]
    ctx.a_shape, ctx.b_shape = list(a.shape), list(b.shape)
    ctx.alpha = inputs[2] if len(inputs) == 4 else 1.0
    ctx.backend = inputs[-1]


def _add_backward(ctx: Any, grad: Tensor) -> tuple:
    ga = _sum_to(grad, ctx.a_shape, 1.0, ctx.backend) if ctx.needs_input_grad[0] else None
    gb = _sum_to(grad, ctx.b_shape, ctx.alpha, ctx.backend) if ctx.needs_input_grad[1] else None
    return ga, gb, None, None


def _sub_backward(ctx: Any, grad: Tensor) -> tuple:
    ga = _sum_to(grad, ctx.a_shape, 1.0, ctx.backend) if ctx.needs_input_grad[0] else None
    gb = _sum_to(grad, ctx.b_shape, -ctx.alpha, ctx.backend) if ctx.needs_input_grad[1] else None
    return ga, gb, None, None


def _mul_setup(ctx: Any, inputs: tuple, output: Tensor) -> None:
    a, b, backend = inputs
    ctx.save_for_backward(a, b)
    ctx.backend = backend


def _mul_backward(ctx: Any, grad: Tensor) -> tuple:
    a, b = ctx.saved_tensors
    ga = mul_sum_to_op(grad, b, list(a.shape), ctx.backend) if ctx.needs_input_grad[0] else None
    gb = mul_sum_to_op(grad, a, list(b.shape), ctx.backend) if ctx.needs_input_grad[1] else None
    return ga, gb, None


add_op.register_autograd(_add_backward, setup_context=_binary_setup)
sub_op.register_autograd(_sub_backward, setup_context=_binary_setup)
mul_op.register_autograd(_mul_backward, setup_context=_mul_setup)


@_takes_executor
def add(input: Tensor | float, other: Tensor | float, *, alpha: float = 1,
        executor: Executor | str | None = None) -> Tensor:
    """``input + alpha * other`` (``torch.add``), broadcasting and promoting like torch."""
    a, b = _promote(input, other, "add")
    return add_op(a, b, float(alpha), backend_name(executor))


@_takes_executor
def sub(input: Tensor | float, other: Tensor | float, *, alpha: float = 1,
        executor: Executor | str | None = None) -> Tensor:
    """``input - alpha * other`` (``torch.sub``), broadcasting and promoting like torch."""
    a, b = _promote(input, other, "sub")
    return sub_op(a, b, float(alpha), backend_name(executor))


@_takes_executor
def mul(input: Tensor | float, other: Tensor | float, *,
        executor: Executor | str | None = None) -> Tensor:
    """``input * other`` (``torch.mul``), broadcasting and promoting like torch."""
    a, b = _promote(input, other, "mul")
    return mul_op(a, b, backend_name(executor))


# --------------------------------------------------------------------------------------
# activations: relu, sigmoid, tanh, gelu
# --------------------------------------------------------------------------------------
def _relu_grad(g: Var, y: Var) -> Var:
    # torch's threshold_backward: zero where the output is <= 0 (NaN passes the gradient).
    return (y < 0.0).where(0.0, y.eq(0.0).where(0.0, g))


def _gelu_erf_grad(g: Var, x: Var) -> Var:
    cdf = 0.5 * (1.0 + (x * C.INV_SQRT2).erf())
    pdf = _INV_SQRT_2PI * (x * x * -0.5).exp()
    return g * (cdf + x * pdf)


def _gelu_tanh_grad(g: Var, x: Var) -> Var:
    x_sq = x * x
    inner = _SQRT_2_OVER_PI * (x + _GELU_KAPPA * (x_sq * x))
    t = inner.tanh()
    left = 0.5 * x
    right = 1.0 + t
    d_left = 0.5 * right
    d_right = left * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_KAPPA * x_sq)
    return g * (d_left + d_right)


_GELU_GRADS = {"none": _gelu_erf_grad, "tanh": _gelu_tanh_grad}


@torch.library.custom_op("hologram::relu", mutates_args=())
def relu_op(x: Tensor, backend: str) -> Tensor:
    """max(x, 0), NaN-propagating like torch.relu."""
    return _ew(("relu",), C.relu, [x], backend, x.shape)[0]


@torch.library.custom_op("hologram::relu_backward", mutates_args=())
def relu_backward_op(grad: Tensor, output: Tensor, backend: str) -> Tensor:
    return _ew(("relu_backward",), _relu_grad, [grad, output], backend, output.shape)[0]


@torch.library.custom_op("hologram::sigmoid", mutates_args=())
def sigmoid_op(x: Tensor, backend: str) -> Tensor:
    return _ew(("sigmoid",), lambda v: v.sigmoid(), [x], backend, x.shape)[0]


@torch.library.custom_op("hologram::sigmoid_backward", mutates_args=())
def sigmoid_backward_op(grad: Tensor, output: Tensor, backend: str) -> Tensor:
    return _ew(("sigmoid_backward",), lambda g, y: g * (1.0 - y) * y, [grad, output], backend,
               output.shape)[0]


@torch.library.custom_op("hologram::tanh", mutates_args=())
def tanh_op(x: Tensor, backend: str) -> Tensor:
    return _ew(("tanh",), lambda v: v.tanh(), [x], backend, x.shape)[0]


@torch.library.custom_op("hologram::tanh_backward", mutates_args=())
def tanh_backward_op(grad: Tensor, output: Tensor, backend: str) -> Tensor:
    return _ew(("tanh_backward",), lambda g, y: g * (1.0 - y * y), [grad, output], backend,
               output.shape)[0]


@torch.library.custom_op("hologram::gelu", mutates_args=())
def gelu_op(x: Tensor, approximate: str, backend: str) -> Tensor:
    """GELU, exact (erf) for approximate='none', the tanh form for 'tanh'."""
    return _ew(("gelu", approximate), C.GELU_FORMS[approximate], [x], backend, x.shape)[0]


@torch.library.custom_op("hologram::gelu_backward", mutates_args=())
def gelu_backward_op(grad: Tensor, x: Tensor, approximate: str, backend: str) -> Tensor:
    return _ew(("gelu_backward", approximate), _GELU_GRADS[approximate], [grad, x], backend,
               x.shape)[0]


def _like_first(x: Tensor, *args: Any) -> Tensor:
    return x.new_empty(x.shape)


for _op in (relu_op, sigmoid_op, tanh_op, gelu_op, relu_backward_op, sigmoid_backward_op,
            tanh_backward_op, gelu_backward_op):
    _op.register_fake(_like_first)


def _save_output(ctx: Any, inputs: tuple, output: Tensor) -> None:
    ctx.save_for_backward(output)
    ctx.backend = inputs[-1]


def _output_backward(op: Any) -> Callable[..., tuple]:
    def backward(ctx: Any, grad: Tensor) -> tuple:
        (y,) = ctx.saved_tensors
        return op(grad, y, ctx.backend), None

    return backward


relu_op.register_autograd(_output_backward(relu_backward_op), setup_context=_save_output)
sigmoid_op.register_autograd(_output_backward(sigmoid_backward_op), setup_context=_save_output)
tanh_op.register_autograd(_output_backward(tanh_backward_op), setup_context=_save_output)


def _gelu_setup(ctx: Any, inputs: tuple, output: Tensor) -> None:
    x, ctx.approximate, ctx.backend = inputs
    ctx.save_for_backward(x)


def _gelu_backward(ctx: Any, grad: Tensor) -> tuple:
    (x,) = ctx.saved_tensors
    return gelu_backward_op(grad, x, ctx.approximate, ctx.backend), None, None


gelu_op.register_autograd(_gelu_backward, setup_context=_gelu_setup)


@_takes_executor
def relu(input: Tensor, inplace: bool = False, *, executor: Executor | str | None = None) -> Tensor:
    """``torch.nn.functional.relu``; ``inplace=True`` writes the result into ``input``."""
    _check_float(input, "input")
    y = relu_op(input, backend_name(executor))
    return input.copy_(y) if inplace else y


@_takes_executor
def sigmoid(input: Tensor, *, executor: Executor | str | None = None) -> Tensor:
    """``torch.sigmoid``."""
    _check_float(input, "input")
    return sigmoid_op(input, backend_name(executor))


@_takes_executor
def tanh(input: Tensor, *, executor: Executor | str | None = None) -> Tensor:
    """``torch.tanh``."""
    _check_float(input, "input")
    return tanh_op(input, backend_name(executor))


@_takes_executor
def gelu(input: Tensor, approximate: str = "none", *,
         executor: Executor | str | None = None) -> Tensor:
    """``torch.nn.functional.gelu``: approximate='none' (erf, torch's default) or 'tanh'."""
    _check_float(input, "input")
    if approximate not in _GELU_GRADS:
        raise RuntimeError(f"approximate argument must be either none or tanh, got "
                           f"{approximate!r}")
    return gelu_op(input, approximate, backend_name(executor))


# --------------------------------------------------------------------------------------
# softmax, log_softmax
# --------------------------------------------------------------------------------------
def _split(shape: Sequence[int], dim: int) -> tuple[int, int, int]:
    """(outer, n, inner): the 3-D view that puts ``dim`` in the middle."""
    if len(shape) == 0:
        return 1, 1, 1
    return _prod(shape[:dim]), int(shape[dim]), _prod(shape[dim + 1:])


def _norm_dim(dim: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {dim})")
    return dim % n if ndim else 0


def _softmax_like(key: str, fn: Callable[[Var], Var], x: Tensor, dim: int,
                  backend: str) -> Tensor:
    x3 = x.reshape(_split(x.shape, dim))
    return _ops.run((key,), fn, [x3], backend)[0].view(x.shape)


def _softmax_grad_like(key: str, fn: Callable[[Var, Var], Var], grad: Tensor, y: Tensor,
                       dim: int, backend: str) -> Tensor:
    s = _split(y.shape, dim)
    return _ops.run((key,), fn, [grad.reshape(s), y.reshape(s)], backend)[0].view(y.shape)


@torch.library.custom_op("hologram::softmax", mutates_args=())
def softmax_op(x: Tensor, dim: int, backend: str) -> Tensor:
    """exp(x - max) / sum, over ``dim`` (already normalised to be non-negative)."""
    return _softmax_like("softmax", lambda v: C.softmax(v, 1), x, dim, backend)


@torch.library.custom_op("hologram::softmax_backward", mutates_args=())
def softmax_backward_op(grad: Tensor, output: Tensor, dim: int, backend: str) -> Tensor:
    return _softmax_grad_like("softmax_backward",
                              lambda g, y: y * (g - (g * y).sum(1, keepdims=True)),
                              grad, output, dim, backend)


@torch.library.custom_op("hologram::log_softmax", mutates_args=())
def log_softmax_op(x: Tensor, dim: int, backend: str) -> Tensor:
    return _softmax_like("log_softmax", lambda v: C.log_softmax(v, 1), x, dim, backend)


@torch.library.custom_op("hologram::log_softmax_backward", mutates_args=())
def log_softmax_backward_op(grad: Tensor, output: Tensor, dim: int, backend: str) -> Tensor:
    return _softmax_grad_like("log_softmax_backward",
                              lambda g, y: g - y.exp() * g.sum(1, keepdims=True),
                              grad, output, dim, backend)


for _op in (softmax_op, log_softmax_op, softmax_backward_op, log_softmax_backward_op):
    _op.register_fake(_like_first)


def _softmax_setup(ctx: Any, inputs: tuple, output: Tensor) -> None:
    _, ctx.dim, ctx.backend = inputs
    ctx.save_for_backward(output)


def _softmax_backward(op: Any) -> Callable[..., tuple]:
    def backward(ctx: Any, grad: Tensor) -> tuple:
        (y,) = ctx.saved_tensors
        return op(grad, y, ctx.dim, ctx.backend), None, None

    return backward


softmax_op.register_autograd(_softmax_backward(softmax_backward_op),
                             setup_context=_softmax_setup)
log_softmax_op.register_autograd(_softmax_backward(log_softmax_backward_op),
                                 setup_context=_softmax_setup)


def _implicit_dim(name: str, ndim: int) -> int:
    """torch's legacy choice when dim=None, with its deprecation warning."""
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call "
                  "to include dim=X as an argument.", stacklevel=4)
    return 0 if ndim in (0, 1, 3) else 1


@_takes_executor
def softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3,
            dtype: torch.dtype | None = None, *, executor: Executor | str | None = None) -> Tensor:
    """``torch.nn.functional.softmax`` over ``dim`` (any dim, any shape)."""
    if dtype is not None:
        input = input.to(dtype)
    _check_float(input, "input")
    d = _implicit_dim("softmax", input.dim()) if dim is None else dim
    return softmax_op(input, _norm_dim(d, input.dim()), backend_name(executor))


@_takes_executor
def log_softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3,
                dtype: torch.dtype | None = None, *,
                executor: Executor | str | None = None) -> Tensor:
    """``torch.nn.functional.log_softmax`` over ``dim``, computed stably (x - max first)."""
    if dtype is not None:
        input = input.to(dtype)
    _check_float(input, "input")
    d = _implicit_dim("log_softmax", input.dim()) if dim is None else dim
    return log_softmax_op(input, _norm_dim(d, input.dim()), backend_name(executor))


# --------------------------------------------------------------------------------------
# linear
# --------------------------------------------------------------------------------------
def _rows(x: Tensor) -> Tensor:
    """``x`` as a 2-D (rows, features) matrix: hologram's GEMM is 2-D."""
    return x.reshape(_prod(x.shape[:-1]), x.shape[-1])


@torch.library.custom_op("hologram::linear", mutates_args=())
def linear_op(x: Tensor, weight: Tensor, bias: Tensor | None, backend: str) -> Tensor:
    """``x @ weight.T + bias``: one GEMM (weight.T is a PERMUTE view) with a fused bias."""
    inputs = [_rows(x), weight] + ([bias] if bias is not None else [])
    if bias is None:
        y = _ops.run(("linear",), lambda a, w: a @ w.T, inputs, backend)[0]
    else:
        y = _ops.run(("linear_bias",), lambda a, w, b: a @ w.T + b, inputs, backend)[0]
    return y.view(*x.shape[:-1], weight.shape[0])


@linear_op.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None, backend: str) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("hologram::linear_grad_input", mutates_args=())
def linear_grad_input_op(grad: Tensor, weight: Tensor, backend: str) -> Tensor:
    """dL/dx = grad @ weight."""
    y = _ops.run(("linear_grad_input",), lambda g, w: g @ w, [_rows(grad), weight], backend)[0]
    return y.view(*grad.shape[:-1], weight.shape[1])


@linear_grad_input_op.register_fake
def _(grad: Tensor, weight: Tensor, backend: str) -> Tensor:
    return grad.new_empty((*grad.shape[:-1], weight.shape[1]))


@torch.library.custom_op("hologram::linear_grad_weight", mutates_args=())
def linear_grad_weight_op(grad: Tensor, x: Tensor, backend: str) -> Tensor:
    """dL/dW = grad.T @ x over all leading (batch) rows."""
    return _ops.run(("linear_grad_weight",), lambda g, a: g.T @ a, [_rows(grad), _rows(x)],
                    backend)[0]


@linear_grad_weight_op.register_fake
def _(grad: Tensor, x: Tensor, backend: str) -> Tensor:
    return grad.new_empty((grad.shape[-1], x.shape[-1]))


def _linear_setup(ctx: Any, inputs: tuple, output: Tensor) -> None:
    x, w, b, ctx.backend = inputs
    ctx.save_for_backward(x, w)
    ctx.bias_shape = list(b.shape) if b is not None else None


def _linear_backward(ctx: Any, grad: Tensor) -> tuple:
    x, w = ctx.saved_tensors
    need = ctx.needs_input_grad
    gx = linear_grad_input_op(grad, w, ctx.backend) if need[0] else None
    gw = linear_grad_weight_op(grad, x, ctx.backend) if need[1] else None
    gb = None
    if ctx.bias_shape is not None and need[2]:
        gb = _sum_to(_rows(grad) if grad.dim() != 1 else grad, ctx.bias_shape, 1.0,
                     ctx.backend)
    return gx, gw, gb, None


linear_op.register_autograd(_linear_backward, setup_context=_linear_setup)


@_takes_executor
def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None, *,
           executor: Executor | str | None = None) -> Tensor:
    """``torch.nn.functional.linear``: ``input @ weight.T + bias`` for input of any rank."""
    for name, t in (("input", input), ("weight", weight), ("bias", bias)):
        if t is not None:
            _check_float(t, name)
            if t.dtype != input.dtype:
                raise RuntimeError(f"linear: {name} has dtype {t.dtype}, input has "
                                   f"{input.dtype} (torch requires one dtype too)")
    if weight.dim() != 2:
        raise RuntimeError(f"linear: weight must be 2-D, got {weight.dim()}-D")
    if input.dim() == 0 or input.shape[-1] != weight.shape[1]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied "
                           f"({_prod(input.shape[:-1])}x{input.shape[-1] if input.dim() else 1}"
                           f" and {weight.shape[1]}x{weight.shape[0]})")
    if bias is not None and torch.broadcast_shapes(bias.shape, (weight.shape[0],)) != (
            weight.shape[0],):
        raise RuntimeError(f"linear: bias of shape {tuple(bias.shape)} does not broadcast to "
                           f"({weight.shape[0]},)")
    return linear_op(input, weight, bias, backend_name(executor))


# --------------------------------------------------------------------------------------
# layer_norm
# --------------------------------------------------------------------------------------
def _ln_split(x: Tensor, normalized_shape: Sequence[int]) -> tuple[int, int]:
    k = len(normalized_shape)
    return _prod(x.shape[:x.dim() - k]), _prod(normalized_shape)


@torch.library.custom_op("hologram::layer_norm", mutates_args=())
def layer_norm_op(x: Tensor, normalized_shape: list[int], weight: Tensor | None,
                  bias: Tensor | None, eps: float, backend: str) -> Tensor:
    """Normalise over the trailing ``normalized_shape`` dims, two-pass variance."""
    m, n = _ln_split(x, normalized_shape)
    has_w, has_b = weight is not None, bias is not None
    inputs = [x.reshape(m, n)]
    inputs += [weight.reshape(n)] if weight is not None else []
    inputs += [bias.reshape(n)] if bias is not None else []

    def fn(v: Var, *wb: Var) -> Var:
        w = wb[0] if has_w else None
        b = wb[-1] if has_b else None
        return C.layer_norm(v, w, b, (1,), eps)

    return _ops.run(("layer_norm", has_w, has_b, eps), fn, inputs, backend)[0].view(x.shape)


@layer_norm_op.register_fake
def _(x: Tensor, normalized_shape: list[int], weight: Tensor | None, bias: Tensor | None,
      eps: float, backend: str) -> Tensor:
    return x.new_empty(x.shape)


@torch.library.custom_op("hologram::layer_norm_backward", mutates_args=())
def layer_norm_backward_op(grad: Tensor, x: Tensor, normalized_shape: list[int],
                           weight: Tensor | None, eps: float, need_weight: bool,
                           need_bias: bool, backend: str) -> tuple[Tensor, Tensor, Tensor]:
    """(dL/dx, dL/dweight, dL/dbias); statistics are recomputed from x, not stored."""
    m, n = _ln_split(x, normalized_shape)
    has_w = weight is not None
    inputs = [grad.reshape(m, n), x.reshape(m, n)]
    inputs += [weight.reshape(n)] if weight is not None else []

    def fn(g: Var, v: Var, *w: Var) -> tuple[Var, ...]:
        d = v - v.mean(1, keepdims=True)
        rstd = ((d * d).mean(1, keepdims=True) + eps).rsqrt()
        xhat = d * rstd
        gy = g * w[0] if has_w else g
        gx = rstd * (gy - gy.mean(1, keepdims=True) - xhat * (gy * xhat).mean(1, keepdims=True))
        outs = [gx]
        if need_weight:
            outs.append((g * xhat).sum(0))
        if need_bias:
            outs.append(g.sum(0))
        return tuple(outs)

    outs = _ops.run(("layer_norm_backward", has_w, need_weight, need_bias, eps), fn, inputs,
                    backend)
    gx = outs[0].view(x.shape)
    rest = iter(outs[1:])
    gw = next(rest).view(tuple(normalized_shape)) if need_weight else _none().to(x.dtype)
    gb = next(rest).view(tuple(normalized_shape)) if need_bias else _none().to(x.dtype)
    return gx, gw, gb


@layer_norm_backward_op.register_fake
def _(grad: Tensor, x: Tensor, normalized_shape: list[int], weight: Tensor | None, eps: float,
      need_weight: bool, need_bias: bool, backend: str) -> tuple[Tensor, Tensor, Tensor]:
    ns = tuple(normalized_shape)
    return (x.new_empty(x.shape), x.new_empty(ns if need_weight else (0,)),
            x.new_empty(ns if need_bias else (0,)))


def _ln_setup(ctx: Any, inputs: tuple, output: Tensor) -> None:
    x, ctx.normalized_shape, w, b, ctx.eps, ctx.backend = inputs
    ctx.has_bias = b is not None
    ctx.save_for_backward(x, w)


def _ln_backward(ctx: Any, grad: Tensor) -> tuple:
    x, w = ctx.saved_tensors
    need = ctx.needs_input_grad
    need_w = w is not None and need[2]
    need_b = ctx.has_bias and need[3]
    gx, gw, gb = layer_norm_backward_op(grad, x, ctx.normalized_shape, w, ctx.eps, need_w,
                                        need_b, ctx.backend)
    return (gx if need[0] else None, None, gw if need_w else None, gb if need_b else None,
            None, None)


layer_norm_op.register_autograd(_ln_backward, setup_context=_ln_setup)


@_takes_executor
def layer_norm(input: Tensor, normalized_shape: int | Sequence[int],
               weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5,
               *, executor: Executor | str | None = None) -> Tensor:
    """``torch.nn.functional.layer_norm`` over the trailing ``normalized_shape`` dims."""
    ns = [int(normalized_shape)] if isinstance(normalized_shape, int) else [
        int(s) for s in normalized_shape]
    _check_float(input, "input")
    if input.dim() < len(ns) or list(input.shape[input.dim() - len(ns):]) != ns:
        raise RuntimeError(f"Given normalized_shape={ns}, expected input with shape "
                           f"[*, {', '.join(map(str, ns))}], but got input of size "
                           f"{list(input.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            _check_float(t, name)
            if list(t.shape) != ns:
                raise RuntimeError(f"layer_norm: {name} has shape {list(t.shape)}, expected {ns}")
            if t.dtype != input.dtype:
                raise RuntimeError(f"layer_norm: {name} has dtype {t.dtype}, input has "
                                   f"{input.dtype}")
    return layer_norm_op(input, ns, weight, bias, float(eps), backend_name(executor))


# --------------------------------------------------------------------------------------
# losses
# --------------------------------------------------------------------------------------
def _reduce(per: Var, reduction: str, denominator: Var | None = None) -> Var:
    if reduction == "none":
        return per
    if reduction == "sum":
        return per.sum()
    return per.sum() / denominator if denominator is not None else per.mean()


def _grad_scale(g: Var, reduction: str, count: int) -> Var:
    """The upstream gradient as a per-element factor (broadcast by the caller's math)."""
    if reduction == "mean":
        return g / float(count) if count else g / 0.0
    return g


def _loss_out_fake(input: Tensor, reduction: str, none_shape: Sequence[int]) -> Tensor:
    return input.new_empty(tuple(none_shape) if reduction == "none" else ())


def _opt(t: Tensor | None) -> list[Tensor]:
    return [t] if t is not None else []


def _take(vs: Sequence[Var], *present: bool) -> list[Var | None]:
    """Unpack optional program inputs in order (absent ones become None)."""
    it = iter(vs)
    return [next(it) if p else None for p in present]


# ---- mse_loss ------------------------------------------------------------------------
@torch.library.custom_op("hologram::mse_loss", mutates_args=())
def mse_loss_op(input: Tensor, target: Tensor, weight: Tensor | None, reduction: str,
                backend: str) -> Tensor:
    """Squared error, optionally weighted ('mean' then divides by the weight sum, as torch)."""
    has_w = weight is not None

    def fn(x: Var, t: Var, *w: Var) -> Var:
        se = C.squared_error(x, t)
        if has_w:
            se = se * w[0]
            return _reduce(se, reduction, w[0].sum() if reduction == "mean" else None)
        return _reduce(se, reduction)

    out = _ops.run(("mse_loss", reduction, has_w), fn,
                   [_flat(input), _flat(target), *map(_flat, _opt(weight))], backend)[0]
    return out.view(input.shape) if reduction == "none" else out


@mse_loss_op.register_fake
def _(input: Tensor, target: Tensor, weight: Tensor | None, reduction: str,
      backend: str) -> Tensor:
    return _loss_out_fake(input, reduction, input.shape)


@torch.library.custom_op("hologram::mse_loss_backward", mutates_args=())
def mse_loss_backward_op(grad: Tensor, input: Tensor, target: Tensor, weight: Tensor | None,
                         reduction: str, need_target: bool,
                         backend: str) -> tuple[Tensor, Tensor]:
    has_w = weight is not None
    n = input.numel()
    norm = (2.0 / n if n else 0.0) if reduction == "mean" and not has_w else 2.0

    def fn(g: Var, x: Var, t: Var, *w: Var) -> tuple[Var, ...]:
        gi = (x - t) * norm * g
        if has_w:
            gi = gi * w[0]
            if reduction == "mean":
                gi = gi / w[0].sum()
        return (gi, -gi) if need_target else (gi,)

    g = _flat(grad) if reduction == "none" else grad
    outs = _ops.run(("mse_loss_backward", reduction, has_w, need_target), fn,
                    [g, _flat(input), _flat(target), *map(_flat, _opt(weight))], backend)
    gi = outs[0].view(input.shape)
    gt = outs[1].view(input.shape) if need_target else _none().to(input.dtype)
    return gi, gt


@mse_loss_backward_op.register_fake
def _(grad: Tensor, input: Tensor, target: Tensor, weight: Tensor | None, reduction: str,
      need_target: bool, backend: str) -> tuple[Tensor, Tensor]:
    return input.new_empty(input.shape), input.new_empty(input.shape if need_target else (0,))


def _loss_setup(ctx: Any, inputs: tuple, output: Tensor) -> None:
    """Save every tensor argument (optional ones may be None) through save_for_backward,
    which autograd and torch.compile track; keep the plain arguments on ctx."""
    ctx.is_tensor = [a is None or isinstance(a, Tensor) for a in inputs]
    ctx.constants = [a for a, t in zip(inputs, ctx.is_tensor, strict=True) if not t]
    ctx.save_for_backward(*(a for a, t in zip(inputs, ctx.is_tensor, strict=True) if t))


def _loss_args(ctx: Any) -> list[Any]:
    """The op's arguments again, in order, as ``_loss_setup`` saw them."""
    tensors, constants = iter(ctx.saved_tensors), iter(ctx.constants)
    return [next(tensors) if t else next(constants) for t in ctx.is_tensor]


def _mse_backward(ctx: Any, grad: Tensor) -> tuple:
    x, t, weight, reduction, backend = _loss_args(ctx)
    need = ctx.needs_input_grad
    gi, gt = mse_loss_backward_op(grad, x, t, weight, reduction, need[1], backend)
    return gi if need[0] else None, gt if need[1] else None, None, None, None


mse_loss_op.register_autograd(_mse_backward, setup_context=_loss_setup)


@_takes_executor
def mse_loss(input: Tensor, target: Tensor, size_average: bool | None = None,
             reduce: bool | None = None, reduction: str = "mean",
             weight: Tensor | None = None, *, executor: Executor | str | None = None) -> Tensor:
    """``torch.nn.functional.mse_loss`` (broadcasting with torch's warning, optional weight)."""
    if target.size() != input.size():
        warnings.warn(f"Using a target size ({target.size()}) that is different to the input "
                      f"size ({input.size()}). This will likely lead to incorrect results due "
                      "to broadcasting. Please ensure they have the same size.", stacklevel=3)
    reduction = _reduction(size_average, reduce, reduction)
    x, t = _promote(input, target, "mse_loss")
    x, t = torch.broadcast_tensors(x, t)
    if weight is not None:
        if weight.size() != input.size():
            raise ValueError("Weights and input must have the same size.")
        _no_grad_for("weight", weight)
        weight = weight.to(x.dtype)
    return mse_loss_op(x, t, weight, reduction, backend_name(executor))


# ---- cross_entropy -------------------------------------------------------------------
def _ce_split(input: Tensor) -> tuple[int, int, int]:
    """(N, C, R): batch, classes (dim 1, or dim 0 unbatched) and the flattened rest."""
    if input.dim() == 1:
        return 1, int(input.shape[0]), 1
    return int(input.shape[0]), int(input.shape[1]), _prod(input.shape[2:])


def _ce_none_shape(input: Tensor) -> tuple[int, ...]:
    return () if input.dim() == 1 else (input.shape[0], *input.shape[2:])


def _ce_inputs(input: Tensor, target: Tensor, weight: Tensor | None,
               ignore_index: int, check: bool) -> tuple[list[Tensor], bool]:
    """Program inputs: logits (N,C,R), target (N,C,R) probabilities or (N,1,R) class
    indices as floats plus the class ids (1,C,1) to compare them with, and the weight."""
    n, c, r = _ce_split(input)
    probs = target.is_floating_point()
    ins = [input.reshape(n, c, r)]
    if probs:
        ins.append(target.to(input.dtype).reshape(n, c, r))
    else:
        if check:
            bad = ((target < 0) | (target >= c)) & (target != ignore_index)
            if bool(bad.any()):
                raise IndexError(f"Target {int(target[bad].flatten()[0])} is out of bounds.")
        ins.append(target.to(input.dtype).reshape(n, 1, r))
        ins.append(torch.arange(c, dtype=input.dtype).reshape(1, c, 1))
    if weight is not None:
        ins.append(weight.reshape(1, c, 1))
    return ins, probs


def _ce_terms(probs: bool, has_w: bool, ignore_index: int, ls: float, c: int,
              vs: Sequence[Var]) -> dict[str, Any]:
    """The pieces forward and backward share, as Var expressions.

    Per row i (over N and the rest), with class weights w (1 if absent):
      q[i, c]   the effective target distribution times the weights, so that
      loss[i] = -sum_c q[i, c] * log_softmax(x)[i, c], and the gradient is
      s[i] * (softmax(x)[i, c] * sum_c q[i, c] - q[i, c]).
    """
    x = vs[0]
    logp = C.log_softmax(x, 1)
    if probs:
        t, w = _take(vs[1:], True, has_w)
        tt = t * (1.0 - ls) + ls / c if ls else t
        q = tt * w if w is not None else tt
        return {"logp": logp, "q": q, "tt": tt, "w": w, "t": t}
    t, iota, w = _take(vs[1:], True, True, has_w)
    hit = iota.eq(t)  # one-hot of the class index, (N, C, R)
    ignored = t.eq(float(ignore_index))  # (N, 1, R)
    wc = w if w is not None else _full(logp, 1.0)
    w_t = hit.where(wc, 0.0).sum(1, keepdims=True)  # weight of each row's class
    picked = hit.where(logp, 0.0).sum(1, keepdims=True)  # log-prob of the class (no 0*inf)
    nll = -(w_t * picked)
    if ls:
        smooth = -(logp * w).sum(1, keepdims=True) if w is not None else -logp.sum(
            1, keepdims=True)
        per = nll * (1.0 - ls) + smooth * (ls / c)
        q = hit.where(wc * (1.0 - ls), 0.0) + (w * (ls / c) if w is not None else ls / c)
    else:
        per = nll
        q = hit.where(wc, 0.0)
    per = ignored.where(0.0, per)
    return {"logp": logp, "q": q, "per": per, "ignored": ignored,
            "denominator": ignored.where(0.0, w_t).sum()}


@torch.library.custom_op("hologram::cross_entropy", mutates_args=())
def cross_entropy_op(input: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
                     label_smoothing: float, reduction: str, backend: str) -> Tensor:
    """Cross entropy of logits against class indices or class probabilities (torch's
    semantics: ignore_index, class weights, label smoothing, weighted 'mean')."""
    n, c, r = _ce_split(input)
    ins, probs = _ce_inputs(input, target, weight, ignore_index, check=True)
    has_w = weight is not None

    def fn(*vs: Var) -> Var:
        k = _ce_terms(probs, has_w, ignore_index, label_smoothing, c, vs)
        if probs:
            per = -(k["q"] * k["logp"]).sum(1, keepdims=True)
            return _reduce(per, reduction)  # 'mean' divides by N*R, not by weights
        return _reduce(k["per"], reduction, k["denominator"] if reduction == "mean" else None)

    key = ("cross_entropy", probs, has_w, ignore_index, label_smoothing, reduction)
    out = _ops.run(key, fn, ins, backend)[0]
    return out.view(_ce_none_shape(input)) if reduction == "none" else out


@cross_entropy_op.register_fake
def _(input: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
      label_smoothing: float, reduction: str, backend: str) -> Tensor:
    return _loss_out_fake(input, reduction, _ce_none_shape(input))


@torch.library.custom_op("hologram::cross_entropy_backward", mutates_args=())
def cross_entropy_backward_op(grad: Tensor, input: Tensor, target: Tensor,
                              weight: Tensor | None, ignore_index: int, label_smoothing: float,
                              reduction: str, need_target: bool,
                              backend: str) -> tuple[Tensor, Tensor]:
    n, c, r = _ce_split(input)
    ins, probs = _ce_inputs(input, target, weight, ignore_index, check=False)
    has_w = weight is not None
    need_target = need_target and probs
    g = grad.reshape(n, 1, r) if reduction == "none" else grad

    def fn(gv: Var, *vs: Var) -> tuple[Var, ...]:
        k = _ce_terms(probs, has_w, ignore_index, label_smoothing, c, vs)
        if reduction == "mean":
            s = gv / k["denominator"] if not probs else _grad_scale(gv, "mean", n * r)
        else:
            s = gv
        q = k["q"]
        gx = (k["logp"].exp() * q.sum(1, keepdims=True) - q) * s
        if not probs:
            return (k["ignored"].where(0.0, gx),)
        outs = [gx]
        if need_target:
            gt = -(k["logp"] * (1.0 - label_smoothing)) * s
            outs.append(gt * k["w"] if k["w"] is not None else gt)
        return tuple(outs)

    key = ("cross_entropy_backward", probs, has_w, ignore_index, label_smoothing, reduction,
           need_target)
    outs = _ops.run(key, fn, [g, *ins], backend)
    gx = outs[0].view(input.shape)
    gt = outs[1].view(input.shape) if need_target else _none().to(input.dtype)
    return gx, gt


@cross_entropy_backward_op.register_fake
def _(grad: Tensor, input: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
      label_smoothing: float, reduction: str, need_target: bool,
      backend: str) -> tuple[Tensor, Tensor]:
    probs = target.is_floating_point()
    return (input.new_empty(input.shape),
            input.new_empty(input.shape if need_target and probs else (0,)))


def _ce_backward(ctx: Any, grad: Tensor) -> tuple:
    x, t, weight, ignore_index, ls, reduction, backend = _loss_args(ctx)
    need = ctx.needs_input_grad
    need_t = bool(need[1]) and t.is_floating_point()
    gx, gt = cross_entropy_backward_op(grad, x, t, weight, ignore_index, ls, reduction, need_t,
                                       backend)
    return (gx if need[0] else None, gt if need_t else None, None, None, None, None, None)


cross_entropy_op.register_autograd(_ce_backward, setup_context=_loss_setup)


@_takes_executor
def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                  size_average: bool | None = None, ignore_index: int = -100,
                  reduce: bool | None = None, reduction: str = "mean",
                  label_smoothing: float = 0.0, *,
                  executor: Executor | str | None = None) -> Tensor:
    """``torch.nn.functional.cross_entropy`` for class-index or probability targets.

    Classes are dim 1 (dim 0 for an unbatched 1-D input); extra dims (N, C, d1, ...)
    are supported. Index targets become a one-hot comparison inside the program, so
    no (N, C) one-hot tensor is materialised.
    """
    reduction = _reduction(size_average, reduce, reduction)
    _check_float(input, "input")
    if input.dim() == 0:
        raise ValueError("cross_entropy: input must have at least 1 dimension (classes)")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    if target.shape == input.shape:  # torch's rule: same shape means class probabilities
        if not target.is_floating_point():
            raise RuntimeError(f"Expected floating point type for target with class "
                               f"probabilities, got {target.dtype}")
        if ignore_index >= 0:
            raise RuntimeError("ignore_index is not supported for floating point target")
        target = target.to(input.dtype)
    else:
        if target.is_floating_point() or target.dtype == torch.bool or target.is_complex():
            raise RuntimeError(f"cross_entropy: class-index targets must be integers, got "
                               f"{target.dtype} (probability targets need the input's shape "
                               f"{list(input.shape)})")
        if tuple(target.shape) != _ce_none_shape(input):
            raise RuntimeError(f"cross_entropy: expected target of shape "
                               f"{list(_ce_none_shape(input))} for input of shape "
                               f"{list(input.shape)}, got {list(target.shape)}")
    c = input.shape[0 if input.dim() == 1 else 1]
    if weight is not None:
        _check_float(weight, "weight")
        if weight.shape != (c,):
            raise RuntimeError(f"cross_entropy: weight should be a 1-D tensor of {c} classes, "
                               f"got shape {list(weight.shape)}")
        _no_grad_for("weight", weight)
        weight = weight.to(input.dtype)
    return cross_entropy_op(input, target, weight, int(ignore_index), float(label_smoothing),
                            reduction, backend_name(executor))


# ---- binary_cross_entropy ------------------------------------------------------------
def _weighted(v: Var, w: Var | None) -> Var:
    return v * w if w is not None else v


@torch.library.custom_op("hologram::binary_cross_entropy", mutates_args=())
def binary_cross_entropy_op(input: Tensor, target: Tensor, weight: Tensor | None,
                            reduction: str, backend: str) -> Tensor:
    """BCE of probabilities; logs clamped at -100 like torch, inputs checked to be in [0, 1]."""
    if bool((~((input >= 0) & (input <= 1))).any()):
        raise RuntimeError("all elements of input should be between 0 and 1")
    has_w = weight is not None

    def fn(x: Var, t: Var, *w: Var) -> Var:
        return _reduce(_weighted(C.binary_cross_entropy(x, t), w[0] if has_w else None),
                       reduction)

    flat = weight is None or weight.shape == input.shape
    ins = [_flat(input), _flat(target), *map(_flat, _opt(weight))] if flat else [
        input, target, weight]
    out = _ops.run(("binary_cross_entropy", reduction, has_w, flat), fn, ins, backend)[0]
    return out.view(input.shape) if reduction == "none" else out


@binary_cross_entropy_op.register_fake
def _(input: Tensor, target: Tensor, weight: Tensor | None, reduction: str,
      backend: str) -> Tensor:
    return _loss_out_fake(input, reduction, input.shape)


@torch.library.custom_op("hologram::binary_cross_entropy_backward", mutates_args=())
def binary_cross_entropy_backward_op(grad: Tensor, input: Tensor, target: Tensor,
                                     weight: Tensor | None, reduction: str, need_target: bool,
                                     backend: str) -> tuple[Tensor, Tensor]:
    has_w = weight is not None
    count = input.numel()

    def fn(g: Var, x: Var, t: Var, *w: Var) -> tuple[Var, ...]:
        s = _grad_scale(g, reduction, count)
        wv = w[0] if has_w else None
        gi = _weighted((x - t) / ((1.0 - x) * x).maximum(1e-12) * s, wv)
        if not need_target:
            return (gi,)
        return gi, _weighted(((1.0 - x) / x).log() * s, wv)

    flat = weight is None or weight.shape == input.shape
    g = (_flat(grad) if flat else grad) if reduction == "none" else grad
    ins = [_flat(input), _flat(target), *map(_flat, _opt(weight))] if flat else [
        input, target, weight]
    outs = _ops.run(("binary_cross_entropy_backward", reduction, has_w, need_target, flat), fn,
                    [g, *ins], backend)
    gi = outs[0].view(input.shape)
    gt = outs[1].view(input.shape) if need_target else _none().to(input.dtype)
    return gi, gt


@binary_cross_entropy_backward_op.register_fake
def _(grad: Tensor, input: Tensor, target: Tensor, weight: Tensor | None, reduction: str,
      need_target: bool, backend: str) -> tuple[Tensor, Tensor]:
    return input.new_empty(input.shape), input.new_empty(input.shape if need_target else (0,))


def _bce_backward(ctx: Any, grad: Tensor) -> tuple:
    x, t, weight, reduction, backend = _loss_args(ctx)
    need = ctx.needs_input_grad
    gi, gt = binary_cross_entropy_backward_op(grad, x, t, weight, reduction, need[1], backend)
    return gi if need[0] else None, gt if need[1] else None, None, None, None


binary_cross_entropy_op.register_autograd(_bce_backward, setup_context=_loss_setup)


def _loss_weight(weight: Tensor | None, input: Tensor, name: str) -> Tensor | None:
    if weight is None:
        return None
    _check_float(weight, name)
    if torch.broadcast_shapes(weight.shape, input.shape) != input.shape:
        raise RuntimeError(f"{name} of shape {list(weight.shape)} does not broadcast to the "
                           f"input's shape {list(input.shape)}")
    _no_grad_for(name, weight)
    return weight.to(input.dtype)


@_takes_executor
def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                         size_average: bool | None = None, reduce: bool | None = None,
                         reduction: str = "mean", *,
                         executor: Executor | str | None = None) -> Tensor:
    """``torch.nn.functional.binary_cross_entropy`` of probabilities in [0, 1]."""
    reduction = _reduction(size_average, reduce, reduction)
    if target.size() != input.size():
        raise ValueError(f"Using a target size ({target.size()}) that is different to the input "
                         f"size ({input.size()}) is deprecated. Please ensure they have the same "
                         "size.")
    x, t = _promote(input, target, "binary_cross_entropy")
    return binary_cross_entropy_op(x, t, _loss_weight(weight, x, "weight"), reduction,
                                   backend_name(executor))


# ---- binary_cross_entropy_with_logits ------------------------------------------------
def _log_sigmoid(x: Var) -> Var:
    """log(sigmoid(x)) = min(x, 0) - log(1 + exp(-|x|)), finite for large |x|."""
    return x.minimum(0.0) - ((-abs(x)).exp() + 1.0).log()


@torch.library.custom_op("hologram::binary_cross_entropy_with_logits", mutates_args=())
def bce_with_logits_op(input: Tensor, target: Tensor, weight: Tensor | None,
                       pos_weight: Tensor | None, reduction: str, backend: str) -> Tensor:
    """(1 - t) x - (1 + (pos_weight - 1) t) log_sigmoid(x), weighted and reduced (torch's form)."""
    has_w, has_pw = weight is not None, pos_weight is not None

    def fn(x: Var, t: Var, *rest: Var) -> Var:
        w, pw = _take(rest, has_w, has_pw)
        ls = _log_sigmoid(x)
        if pw is not None:
            ls = ls * ((pw - 1.0) * t + 1.0)
        return _reduce(_weighted((1.0 - t) * x - ls, w), reduction)

    ins, flat = _bcel_inputs(input, target, weight, pos_weight)
    out = _ops.run(("bce_with_logits", reduction, has_w, has_pw, flat), fn, ins, backend)[0]
    return out.view(input.shape) if reduction == "none" else out


def _bcel_inputs(input: Tensor, target: Tensor, weight: Tensor | None,
                 pos_weight: Tensor | None) -> tuple[list[Tensor], bool]:
    """Flat views when every operand has the input's shape, else broadcast in the program."""
    extra = _opt(weight) + _opt(pos_weight)
    flat = all(e.shape == input.shape for e in extra)
    ins = [input, target, *extra]
    return ([_flat(t) for t in ins] if flat else ins), flat


@bce_with_logits_op.register_fake
def _(input: Tensor, target: Tensor, weight: Tensor | None, pos_weight: Tensor | None,
      reduction: str, backend: str) -> Tensor:
    return _loss_out_fake(input, reduction, input.shape)


@torch.library.custom_op("hologram::binary_cross_entropy_with_logits_backward", mutates_args=())
def bce_with_logits_backward_op(grad: Tensor, input: Tensor, target: Tensor,
                                weight: Tensor | None, pos_weight: Tensor | None,
                                reduction: str, need_target: bool,
                                backend: str) -> tuple[Tensor, Tensor]:
    has_w, has_pw = weight is not None, pos_weight is not None
    count = input.numel()

    def fn(g: Var, x: Var, t: Var, *rest: Var) -> tuple[Var, ...]:
        w, pw = _take(rest, has_w, has_pw)
        s = _grad_scale(g, reduction, count)
        if pw is not None:
            pt = pw * t
            gi = (pt + 1.0 - t) * x.sigmoid() - pt
        else:
            gi = x.sigmoid() - t
        gi = _weighted(gi * s, w)
        if not need_target:
            return (gi,)
        if pw is not None:
            gt = _log_sigmoid(-x) - _log_sigmoid(x) * pw
        else:
            gt = -x
        return gi, _weighted(gt * s, w)

    ins, flat = _bcel_inputs(input, target, weight, pos_weight)
    g = (_flat(grad) if flat else grad) if reduction == "none" else grad
    outs = _ops.run(("bce_with_logits_backward", reduction, has_w, has_pw, need_target, flat),
                    fn, [g, *ins], backend)
    gi = outs[0].view(input.shape)
    gt = outs[1].view(input.shape) if need_target else _none().to(input.dtype)
    return gi, gt


@bce_with_logits_backward_op.register_fake
def _(grad: Tensor, input: Tensor, target: Tensor, weight: Tensor | None,
      pos_weight: Tensor | None, reduction: str, need_target: bool,
      backend: str) -> tuple[Tensor, Tensor]:
    return input.new_empty(input.shape), input.new_empty(input.shape if need_target else (0,))


def _bcel_backward(ctx: Any, grad: Tensor) -> tuple:
    x, t, weight, pos_weight, reduction, backend = _loss_args(ctx)
    need = ctx.needs_input_grad
    gi, gt = bce_with_logits_backward_op(grad, x, t, weight, pos_weight, reduction, need[1],
                                         backend)
    return gi if need[0] else None, gt if need[1] else None, None, None, None, None


bce_with_logits_op.register_autograd(_bcel_backward, setup_context=_loss_setup)


@_takes_executor
def binary_cross_entropy_with_logits(input: Tensor, target: Tensor,
                                     weight: Tensor | None = None,
                                     size_average: bool | None = None,
                                     reduce: bool | None = None, reduction: str = "mean",
                                     pos_weight: Tensor | None = None, *,
                                     executor: Executor | str | None = None) -> Tensor:
    """``torch.nn.functional.binary_cross_entropy_with_logits`` (stable log-sigmoid form)."""
    reduction = _reduction(size_average, reduce, reduction)
    if target.size() != input.size():
        raise ValueError(f"Target size ({target.size()}) must be the same as input size "
                         f"({input.size()})")
    x, t = _promote(input, target, "binary_cross_entropy_with_logits")
    return bce_with_logits_op(x, t, _loss_weight(weight, x, "weight"),
                              _loss_weight(pos_weight, x, "pos_weight"), reduction,
                              backend_name(executor))
