"""Hash-consed values: one node type for every Atlas ISA instruction.

Building the same instruction (same opcode, dtype, shape, operands and
attributes) twice returns the same object. Common subexpressions are therefore
shared for free, identity comparison is structural equality, and a program is a
DAG that prints and hashes cheaply.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator
from typing import Any

from .dtypes import DType
from .opcodes import Op

Shape = tuple[int, ...]
Attrs = tuple[tuple[str, Any], ...]


def contiguous_strides(shape: Shape) -> Shape:
    """Row-major strides of ``shape``, in elements."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(out[::-1])


def _attr_key(v: Any) -> Any:
    """A dict key for an attribute value: floats by bit pattern, so NaN equals NaN
    and 0.0 differs from -0.0 (both matter for exact rewrites)."""
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, float):
        return ("f", v.hex() if math.isfinite(v) else repr(v))
    if isinstance(v, tuple):
        return tuple(_attr_key(x) for x in v)
    return v


class Value:
    """One instruction and the array value it produces (STG produces none)."""

    __slots__ = ("op", "dtype", "shape", "srcs", "attrs", "__weakref__")
    _interned: weakref.WeakValueDictionary[tuple, Value] = weakref.WeakValueDictionary()

    op: Op
    dtype: DType
    shape: Shape
    srcs: tuple[Value, ...]
    attrs: Attrs

    def __new__(
        cls,
        op: Op,
        dtype: DType,
        shape: Shape,
        srcs: tuple[Value, ...] = (),
        attrs: Attrs = (),
    ) -> Value:
        shape = tuple(int(s) for s in shape)
        key = (op, dtype.name, shape, srcs, tuple((k, _attr_key(v)) for k, v in attrs))
        found = cls._interned.get(key)
        if found is not None:
            return found
        self = object.__new__(cls)
        self.op, self.dtype, self.shape, self.srcs, self.attrs = op, dtype, shape, srcs, attrs
        cls._interned[key] = self
        return self

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def walk(self) -> Iterator[Value]:
        """Every value this one depends on, itself last, each once (post-order)."""
        seen: set[int] = set()
        stack: list[tuple[Value, bool]] = [(self, False)]
        while stack:
            v, expanded = stack.pop()
            if expanded:
                yield v
                continue
            if id(v) in seen:
                continue
            seen.add(id(v))
            stack.append((v, True))
            for s in reversed(v.srcs):
                if id(s) not in seen:
                    stack.append((s, False))

    def __repr__(self) -> str:
        shape = ",".join(map(str, self.shape))
        return f"<{self.op}.{self.dtype}[{shape}] srcs={len(self.srcs)} {dict(self.attrs)}>"

    # Identity semantics (hash-consing makes identity structural equality).
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __reduce__(self):  # pickling rebuilds through the interning constructor
        return (Value, (self.op, self.dtype, self.shape, self.srcs, self.attrs))
