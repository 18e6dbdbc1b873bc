"""The handle API of the original ``hologram_ffi`` bindings, for old callers.

The original Python bindings (UniFFI over Rust) exposed executors and buffers as
integer handles and moved data as JSON text. Scripts written against them (the
integration guide's examples among them) keep working through this module,
unchanged, as ``import hologram_ffi as hg``. Everything here is a thin layer over
:class:`hologram.Executor`, :class:`hologram.Buffer` and :mod:`hologram.ops`;
new code should use those directly (zero-copy NumPy/DLPack, no handles).

Handles are positive ints from one counter shared by executors and buffers, and
never reused: a stale handle can then never silently name a newer object, and a
buffer handle passed where an executor is expected is reported as such. Any
unknown, released or foreign handle raises :class:`hologram.errors.HandleError`
naming the handle.

The ``*_f32`` op wrappers are generated from the table ``_OP_TABLE`` (one row per
op of :mod:`hologram.ops`), so a new op is one row, and each wrapper is still a
real module-level function with a signature and a docstring.
"""

from __future__ import annotations

import inspect
import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import ops
from .buffer import Buffer
from .errors import ArgumentTypeError, HandleError, ParseError, ShapeError
from .executor import Executor

# --- registries ---------------------------------------------------------------------
# Module-level, like the original's global handle maps; every access holds _LOCK so
# handles can be created and released from several threads.
_LOCK = threading.RLock()
_COUNTER = itertools.count(1)
_EXECUTORS: dict[int, Executor] = {}
_BUFFERS: dict[int, tuple[int, Buffer]] = {}  # buffer handle -> (executor handle, buffer)
_OWNED: dict[int, set[int]] = {}  # executor handle -> its live buffer handles
_ISSUED = 0  # the highest handle handed out, to tell "released" from "never issued"


def _new_handle() -> int:
    global _ISSUED
    h = next(_COUNTER)
    _ISSUED = h
    return h


def _as_handle(h: Any, what: str) -> int:
    """Handles are ints; NumPy integers pass too (they come out of arrays of handles)."""
    if isinstance(h, (bool, np.bool_)) or not isinstance(h, (int, np.integer)):
        raise HandleError(f"{what}: a handle is an int, got {type(h).__name__} {h!r}")
    return int(h)


def _missing(h: int, what: str, kind: str) -> HandleError:
    """The error for a handle not in the ``kind`` registry, saying as much as is known."""
    if kind == "buffer" and h in _EXECUTORS:
        return HandleError(f"{what}: handle {h} is an executor handle, not a buffer handle")
    if kind == "executor" and h in _BUFFERS:
        return HandleError(f"{what}: handle {h} is a buffer handle, not an executor handle")
    if 0 < h <= _ISSUED:
        return HandleError(f"{what}: {kind} handle {h} was released (cleaned up)")
    return HandleError(f"{what}: unknown {kind} handle {h} (never issued)")


def _executor(h: Any, what: str = "exec_handle") -> Executor:
    h = _as_handle(h, what)
    with _LOCK:
        ex = _EXECUTORS.get(h)
        if ex is None:
            raise _missing(h, what, "executor")
        return ex


def _buffer(exec_h: int, h: Any, what: str = "buffer_handle") -> Buffer:
    """The buffer of handle ``h``, which must belong to executor handle ``exec_h``."""
    h = _as_handle(h, what)
    with _LOCK:
        entry = _BUFFERS.get(h)
        if entry is None:
            raise _missing(h, what, "buffer")
        owner, buf = entry
        if owner != exec_h:
            raise HandleError(
                f"{what}: buffer handle {h} belongs to executor handle {owner}, "
                f"not to executor handle {exec_h}"
            )
        return buf


def _resolve(exec_h: Any, *buffers: tuple[Any, str]) -> tuple[Executor, list[Buffer]]:
    """One executor handle and the buffer handles used with it, checked together."""
    eh = _as_handle(exec_h, "exec_handle")
    return _executor(eh), [_buffer(eh, h, what) for h, what in buffers]


def _count(v: Any, what: str) -> int:
    """Sizes arrive as Python or NumPy ints; the op library takes Python ints."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ArgumentTypeError(f"{what}: expected an int, got {type(v).__name__}")
    if v < 0:
        raise ShapeError(f"{what}: must be >= 0, got {v}")
    return int(v)


# --- executors ----------------------------------------------------------------------
def new_executor_with_backend(backend: str) -> int:
    """A new executor on ``backend`` ('auto', 'cpu', 'cuda', 'metal', 'webgpu',
    'reference'); returns its handle. Raises BackendUnavailableError with the reason
    when that backend cannot run here."""
    ex = Executor(backend)
    with _LOCK:
        h = _new_handle()
        _EXECUTORS[h] = ex
        _OWNED[h] = set()
    return h


def new_executor() -> int:
    """A new executor on the best available backend ('auto'); returns its handle."""
    return new_executor_with_backend("auto")


def new_executor_auto() -> int:
    """Same as :func:`new_executor`; the original API had both names."""
    return new_executor_with_backend("auto")


def executor_cleanup(exec_handle: int) -> None:
    """Close the executor and release its handle and every buffer handle it owns.

    The buffers' memory goes back with the executor, so their handles must die with
    it: a later use of one raises HandleError instead of touching freed memory.
    """
    h = _as_handle(exec_handle, "exec_handle")
    with _LOCK:
        ex = _EXECUTORS.pop(h, None)
        if ex is None:
            raise _missing(h, "exec_handle", "executor")
        for bh in _OWNED.pop(h, set()):
            _BUFFERS.pop(bh, None)
    ex.close()


def clear_all_registries() -> None:
    """Close every executor and release every handle (handles are still never reused).

    For test teardown and for long-running processes that used the handle API and
    want all of its memory back at once.
    """
    with _LOCK:
        executors = list(_EXECUTORS.values())
        _EXECUTORS.clear()
        _BUFFERS.clear()
        _OWNED.clear()
    for ex in executors:
        ex.close()


# --- buffers ------------------------------------------------------------------------
def _register_buffer(exec_h: int, buf: Buffer) -> int:
    with _LOCK:
        if exec_h not in _EXECUTORS:  # cleaned up by another thread meanwhile
            buf.free()
            raise _missing(exec_h, "exec_handle", "executor")
        h = _new_handle()
        _BUFFERS[h] = (exec_h, buf)
        _OWNED[exec_h].add(h)
    return h


def executor_allocate_buffer(exec_handle: int, size: int, dtype: str = "f32") -> int:
    """A new buffer of ``size`` elements (contents undefined); returns its handle.

    ``dtype``: float32 as the original had it, or any dtype of the ISA's table by name
    ('f16', 'bf16', 'f64', 'i8' .. 'u64', 'bool'; bf16 needs ml_dtypes), where the
    executor's backend can store it."""
    eh = _as_handle(exec_handle, "exec_handle")
    buf = _executor(eh).allocate(_count(size, "size"), dtype)
    return _register_buffer(eh, buf)


def executor_allocate_boundary_buffer(exec_handle: int, class_index: int, width: int,
                                      height: int, dtype: str = "f32") -> int:
    """A buffer in the boundary pool at Φ(class_index, 0, 0), ``width`` pages of
    ``height`` bytes (width*height/itemsize elements; float32 unless ``dtype`` says
    otherwise); returns its handle."""
    eh = _as_handle(exec_handle, "exec_handle")
    buf = _executor(eh).allocate_boundary(class_index, width, height, dtype)
    return _register_buffer(eh, buf)


def buffer_cleanup(buffer_handle: int) -> None:
    """Free the buffer and release its handle (a second cleanup raises HandleError)."""
    h = _as_handle(buffer_handle, "buffer_handle")
    with _LOCK:
        entry = _BUFFERS.pop(h, None)
        if entry is None:
            raise _missing(h, "buffer_handle", "buffer")
        owner, buf = entry
        _OWNED.get(owner, set()).discard(h)
    buf.free()


def buffer_length(buffer_handle: int) -> int:
    """Number of elements the buffer holds."""
    h = _as_handle(buffer_handle, "buffer_handle")
    with _LOCK:
        entry = _BUFFERS.get(h)
        if entry is None:
            raise _missing(h, "buffer_handle", "buffer")
        return entry[1].size


def _json_values(json_str: Any) -> np.ndarray:
    """Parse ``json_str`` into a float64 array, rejecting anything but a flat list of
    numbers (NaN, Infinity and -Infinity included, as Python's json writes them).

    Booleans, strings and nulls are rejected rather than coerced: in old callers they
    are bugs (a list of dicts, a stringified number), and silently writing 1.0 or 0.0
    for them would hide the bug in the results.
    """
    if not isinstance(json_str, (str, bytes, bytearray)):
        raise ArgumentTypeError(
            f"json_str: expected JSON text (str), got {type(json_str).__name__}; pass "
            "json.dumps(values), or use buffer_copy_from_bytes for raw float32 data"
        )
    try:
        data = json.loads(json_str)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ParseError(f"json_str: not valid JSON: {e}") from None
    if not isinstance(data, list):
        raise ShapeError(
            f"json_str: expected a JSON list of numbers, got a JSON {type(data).__name__}"
        )
    kinds = {type(v) for v in data}
    if not kinds <= {int, float}:
        i, v = next((i, v) for i, v in enumerate(data) if type(v) not in (int, float))
        if isinstance(v, list):
            raise ShapeError(f"json_str: element {i} is a nested list; expected a flat list")
        raise ParseError(
            f"json_str: element {i} is {json.dumps(v)}, expected a number"
        )
    try:
        return np.array(data, dtype=np.float64)
    except OverflowError:
        i = next(i for i, v in enumerate(data) if not _fits_float(v))
        raise ParseError(f"json_str: element {i} is too large for a float") from None


def _whole_values(json_str: Any, buf: Buffer) -> np.ndarray:
    """The JSON list (already checked to be numbers) as exact integers in the dtype of
    the integer or bool buffer ``buf``; a fraction, NaN or out-of-range value raises
    (float64 would round integers past 2**53, so they are read again as Python ints)."""
    d = buf.isa_dtype
    lo, hi = (0, 1) if d.kind == "b" else (int(np.iinfo(d.np_dtype).min),
                                           int(np.iinfo(d.np_dtype).max))
    data = json.loads(json_str)
    for i, v in enumerate(data):
        if not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())) \
                or not lo <= int(v) <= hi:
            raise ParseError(f"json_str: element {i} is {json.dumps(v)}, not a whole number "
                             f"in [{lo}, {hi}] (the buffer is {d})")
    return np.array([int(v) for v in data], dtype=d.np_dtype)


def _fits_float(v: int | float) -> bool:
    try:
        float(v)
    except OverflowError:
        return False
    return True


def buffer_copy_from_slice(exec_handle: int, buffer_handle: int, json_str: str) -> None:
    """Write the numbers of a JSON list to the start of the buffer (in its dtype).

    The list may be shorter than the buffer (the rest is left as it is), not longer.
    Values beyond a float buffer's range become ±inf, as a float cast does; an integer
    or bool buffer takes only whole numbers in its range (ParseError otherwise).
    """
    _, (buf,) = _resolve(exec_handle, (buffer_handle, "buffer_handle"))
    values = _json_values(json_str)
    if not buf.isa_dtype.is_float:
        values = _whole_values(json_str, buf)
    if values.size > buf.size:
        raise ShapeError(
            f"json_str: has {values.size} values, buffer handle {buffer_handle} holds "
            f"{buf.size}"
        )
    _write_prefix(buf, values)


def _write_prefix(buf: Buffer, values: np.ndarray) -> None:
    """Write ``values`` over the buffer's first elements, keeping the rest.

    Goes through Buffer's own methods rather than a view of its memory, so it works
    on any backend's buffers; a partial write reads the buffer once to keep the tail.
    Values beyond a float dtype's range become ±inf (a float cast), without a warning.
    """
    if values.size != buf.size:
        full = buf.to_numpy().reshape(-1).copy()
        with np.errstate(over="ignore"):
            full[: values.size] = values
        values = full
    with np.errstate(over="ignore"):
        buf.from_numpy(values)


def buffer_to_vec(exec_handle: int, buffer_handle: int) -> str:
    """The buffer's elements as a JSON list.

    Each float is written as the float64 of the same value, so ``json.loads`` and a
    cast back to the buffer's dtype restore it bit for bit; NaN and ±inf are written as
    NaN and ±Infinity (Python's json reads them back). Integers are written exactly,
    bools as 0 and 1 (what ``buffer_copy_from_slice`` takes back).
    """
    _, (buf,) = _resolve(exec_handle, (buffer_handle, "buffer_handle"))
    a = buf.to_numpy().reshape(-1)
    d = buf.isa_dtype
    # f16/bf16 (ml_dtypes' scalars are no JSON numbers) through float64; bool as 0/1
    a = a.astype(np.float64) if d.is_float else a.astype(np.int64) if d.kind == "b" else a
    return json.dumps(a.tolist())


def buffer_copy_from_bytes(exec_handle: int, buffer_handle: int, data: Any) -> None:
    """Write raw native-endian bytes of the buffer's dtype (float32 unless allocated
    otherwise: bytes, bytearray, memoryview, a NumPy
    array's buffer) to the start of the buffer: the fast path the original added to
    avoid JSON. May be shorter than the buffer, not longer, and whole elements only."""
    _, (buf,) = _resolve(exec_handle, (buffer_handle, "buffer_handle"))
    try:
        mv = memoryview(data).cast("B")
    except TypeError:
        raise ArgumentTypeError(f"data: expected bytes-like, got {type(data).__name__}") from None
    itemsize = buf.isa_dtype.itemsize
    if mv.nbytes % itemsize:
        raise ShapeError(f"data: {mv.nbytes} bytes is not a whole number of "
                         f"{buf.isa_dtype} elements ({itemsize} bytes each)")
    if mv.nbytes > buf.nbytes:
        raise ShapeError(
            f"data: has {mv.nbytes} bytes, buffer handle {buffer_handle} holds {buf.nbytes}"
        )
    _write_prefix(buf, np.frombuffer(mv, dtype=buf.dtype))


def buffer_to_bytes(exec_handle: int, buffer_handle: int) -> bytes:
    """The buffer's elements as raw native-endian bytes of its dtype
    (``np.frombuffer(b, np.float32)`` reads a float32 buffer's; a bf16 buffer's are the
    upper halves of float32s: ``np.frombuffer(b, np.uint16).astype(np.uint32) << 16``
    viewed as float32, or ``np.frombuffer(b, ml_dtypes.bfloat16)``)."""
    _, (buf,) = _resolve(exec_handle, (buffer_handle, "buffer_handle"))
    return buf.to_bytes()


def _address(buf: Buffer, what: str) -> int:
    """The first byte of ``buf``'s memory: a host address on host backends, the device
    address on CUDA (the emulated device's device addresses are host addresses)."""
    buf._check(what=what)
    a = buf.view()
    if isinstance(a, np.ndarray):
        return int(a.ctypes.data)
    ptr = getattr(a.handle, "ptr", None)
    if a.nbytes and ptr is None:
        raise ArgumentTypeError(f"{what}: a {buf.device} buffer has no address (its memory is "
                                "reached only through its API)")
    return int(ptr) + a.offset if ptr is not None else 0


def buffer_as_ptr(exec_handle: int, buffer_handle: int) -> int:
    """The buffer's address, to read its elements from native code: the host
    address on the CPU, the device pointer on CUDA.

    Lifetime: the address is valid until the buffer is freed (``buffer_cleanup``,
    ``executor_cleanup``); using it afterwards reads memory the pool may have given to
    another buffer. On a device, work launched on the buffer may still be running:
    synchronize the executor before reading. A freed buffer raises."""
    _, (buf,) = _resolve(exec_handle, (buffer_handle, "buffer_handle"))
    return _address(buf, "buffer_handle")


def buffer_as_mut_ptr(exec_handle: int, buffer_handle: int) -> int:
    """:func:`buffer_as_ptr` for writing: refused (BufferStateError) for a read-only
    buffer, as well as for a freed one. The same lifetime rule holds."""
    _, (buf,) = _resolve(exec_handle, (buffer_handle, "buffer_handle"))
    buf._check(what="buffer_handle")
    buf._require_writable("buffer_as_mut_ptr")
    return _address(buf, "buffer_handle")


def buffer_fill(exec_handle: int, buffer_handle: int, value: float, n: int | None = None
                ) -> None:
    """Set the first ``n`` elements (default: all) to ``value``."""
    _, (buf,) = _resolve(exec_handle, (buffer_handle, "buffer_handle"))
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise ArgumentTypeError(f"value: expected a number, got {type(value).__name__}")
    count = buf.size if n is None else _count(n, "n")
    if count > buf.size:
        raise ShapeError(f"n: {count} exceeds the buffer's {buf.size} elements")
    if count == buf.size:
        with np.errstate(over="ignore"):
            buf.fill(value)
    else:
        _write_prefix(buf, np.full(count, value, dtype=np.float64))


# --- ops ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _OpRow:
    """One ``*_f32`` wrapper: which op it calls and with which arguments.

    ``buffers`` are buffer-handle parameters, ``sizes`` int parameters and
    ``scalars`` float parameters; the op is called as
    ``op(executor, *buffers, *scalars, *sizes)``, the order every op in
    :mod:`hologram.ops` uses, which is also the wrapper's parameter order.
    """

    name: str
    op: Callable[..., Any]
    buffers: tuple[str, ...]
    summary: str
    scalars: tuple[str, ...] = ()
    sizes: tuple[str, ...] = ("n",)
    returns_value: bool = False


_BIN = ("a", "b", "c")
_UN = ("a", "c")
_RED = ("a", "out")
_LOSS = ("pred", "target", "out")

_OP_TABLE: tuple[_OpRow, ...] = (
    _OpRow("vector_add_f32", ops.vector_add, _BIN, "c = a + b, element-wise."),
    _OpRow("vector_sub_f32", ops.vector_sub, _BIN, "c = a - b, element-wise."),
    _OpRow("vector_mul_f32", ops.vector_mul, _BIN, "c = a * b, element-wise."),
    _OpRow("vector_div_f32", ops.vector_div, _BIN, "c = a / b, element-wise (IEEE: x/0 = ±inf)."),
    _OpRow("vector_min_f32", ops.vector_min, _BIN, "c = min(a, b), element-wise."),
    _OpRow("vector_max_f32", ops.vector_max, _BIN, "c = max(a, b), element-wise."),
    _OpRow("vector_abs_f32", ops.vector_abs, _UN, "c = |a|, element-wise."),
    _OpRow("vector_neg_f32", ops.vector_neg, _UN, "c = -a, element-wise."),
    _OpRow("vector_relu_f32", ops.vector_relu, _UN, "c = max(0, a), element-wise (ReLU)."),
    _OpRow("vector_clip_f32", ops.vector_clip, _UN,
           "c = min(max(a, min_val), max_val), element-wise.", scalars=("min_val", "max_val")),
    _OpRow("scalar_add_f32", ops.scalar_add, _UN, "c = a + scalar, element-wise.",
           scalars=("scalar",)),
    _OpRow("scalar_mul_f32", ops.scalar_mul, _UN, "c = a * scalar, element-wise.",
           scalars=("scalar",)),
    _OpRow("sigmoid_f32", ops.sigmoid, _UN, "c = 1 / (1 + exp(-a)), element-wise."),
    _OpRow("tanh_f32", ops.tanh, _UN, "c = tanh(a), element-wise."),
    _OpRow("gelu_f32", ops.gelu, _UN, "c = GELU(a) (tanh approximation), element-wise."),
    _OpRow("softmax_f32", ops.softmax, _UN, "c = softmax(a) over the n elements (stable)."),
    _OpRow("log_softmax_f32", ops.log_softmax, _UN,
           "c = log(softmax(a)) over the n elements (stable)."),
    _OpRow("reduce_sum_f32", ops.reduce_sum, _RED, "Sum of the n elements of a.",
           returns_value=True),
    _OpRow("reduce_min_f32", ops.reduce_min, _RED, "Minimum of the n elements of a.",
           returns_value=True),
    _OpRow("reduce_max_f32", ops.reduce_max, _RED, "Maximum of the n elements of a.",
           returns_value=True),
    _OpRow("mse_loss_f32", ops.mse_loss, _LOSS, "Mean squared error of pred against target.",
           returns_value=True),
    _OpRow("binary_cross_entropy_loss_f32", ops.binary_cross_entropy_loss, _LOSS,
           "Mean binary cross entropy of probabilities pred against target.",
           returns_value=True),
    _OpRow("cross_entropy_loss_f32", ops.cross_entropy_loss, _LOSS,
           "Cross entropy -sum(target * log_softmax(pred)) of one row of n logits.",
           returns_value=True),
    _OpRow("gemm_f32", ops.gemm, _BIN,
           "C (m x n) = A (m x k) @ B (k x n), row-major.", sizes=("m", "k", "n")),
    _OpRow("matvec_f32", ops.matvec, ("a", "x", "y"),
           "y (m) = A (m x n) @ x (n), row-major.", sizes=("m", "n")),
)


def _make_op(row: _OpRow) -> Callable[..., Any]:
    """Build the wrapper for one table row: resolve handles, check sizes, call the op."""
    P = inspect.Parameter
    params = [P("exec_handle", P.POSITIONAL_OR_KEYWORD, annotation=int)]
    params += [P(b, P.POSITIONAL_OR_KEYWORD, annotation=int) for b in row.buffers]
    params += [P(s, P.POSITIONAL_OR_KEYWORD, annotation=float) for s in row.scalars]
    params += [P(s, P.POSITIONAL_OR_KEYWORD, annotation=int) for s in row.sizes]
    sig = inspect.Signature(params, return_annotation=float if row.returns_value else None)
    n_buf, n_scalar = len(row.buffers), len(row.scalars)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        exec_h, *rest = bound.args
        handles = rest[:n_buf]
        scalars = rest[n_buf:n_buf + n_scalar]
        sizes = [_count(v, name) for v, name in zip(rest[n_buf + n_scalar:], row.sizes,
                                                    strict=True)]
        ex, bufs = _resolve(exec_h, *zip(handles, row.buffers, strict=True))
        result = row.op(ex, *bufs, *scalars, *sizes)
        return float(result) if row.returns_value else None

    returns = ("Returns the value as a float (it is also written to out[0])."
               if row.returns_value else "Returns None; the result is in the output buffer.")
    wrapper.__name__ = wrapper.__qualname__ = row.name
    wrapper.__module__ = __name__
    wrapper.__signature__ = sig  # type: ignore[attr-defined]
    wrapper.__doc__ = (
        f"{row.summary}\n\n"
        f"Buffer arguments ({', '.join(row.buffers)}) are handles owned by ``exec_handle``; "
        f"{', '.join(row.sizes)} {'count' if len(row.sizes) > 1 else 'counts'} float32 "
        f"elements (each buffer must hold at least that many; the leading ones are used). "
        f"{returns}\n\n"
        f"Handle-API wrapper of :func:`hologram.ops.{row.op.__name__}`, kept for old "
        "callers; new code should call that with Buffers directly."
    )
    return wrapper


for _row in _OP_TABLE:
    globals()[_row.name] = _make_op(_row)
del _row

OP_NAMES: tuple[str, ...] = tuple(r.name for r in _OP_TABLE)

__all__ = [
    "OP_NAMES",
    "buffer_cleanup",
    "buffer_copy_from_bytes",
    "buffer_copy_from_slice",
    "buffer_fill",
    "buffer_length",
    "buffer_as_mut_ptr",
    "buffer_as_ptr",
    "buffer_to_bytes",
    "buffer_to_vec",
    "clear_all_registries",
    "executor_allocate_boundary_buffer",
    "executor_allocate_buffer",
    "executor_cleanup",
    "new_executor",
    "new_executor_auto",
    "new_executor_with_backend",
    *OP_NAMES,
]
