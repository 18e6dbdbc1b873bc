"""The text form of Atlas ISA programs: printing and parsing.

One instruction per line, operands numbered in definition order::

    .in 0 f32[1024]
    %0 = ldg.f32[1024] in=0
    %1 = const.f32[1024] value=2.0
    %2 = mul.f32[1024] %0, %1
    stg.f32[1024] %2 out=0

Attributes are ``key=value`` with a number, ``nan``/``inf``, True/False or a tuple
of integers. ``parse(format(p))`` rebuilds the identical (hash-consed) program.
"""

from __future__ import annotations

import ast
import re
import warnings
from typing import Any

from ..errors import ParseError
from . import dtypes
from .opcodes import BY_NAME as OPS
from .opcodes import Op
from .value import Value


def _fmt_attr(v: Any) -> str:
    if isinstance(v, tuple):
        return "(" + ",".join(_fmt_attr(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    return repr(v)


def _fmt_type(v: Value) -> str:
    return f"{v.op}.{v.dtype}[{','.join(map(str, v.shape))}]"


def format_instruction(v: Value, names: dict[int, int]) -> str:
    """One line of the text form; ``names`` maps id(value) to its %number."""
    ops = ", ".join(f"%{names[id(s)]}" if id(s) in names else "%?" for s in v.srcs)
    attrs = " ".join(f"{k}={_fmt_attr(x)}" for k, x in v.attrs)
    body = " ".join(p for p in (_fmt_type(v), ops, attrs) if p)
    if v.op is Op.STG:
        return body
    return f"%{names.get(id(v), '?')} = {body}"


def format_program(program: Any) -> str:
    lines = []
    if program.name:
        lines.append(f".name {program.name}")
    for i, (d, s) in enumerate(program.inputs):
        lines.append(f".in {i} {d}[{','.join(map(str, s))}]")
    names: dict[int, int] = {}
    for v in program.instructions:
        if v.op is not Op.STG:
            names[id(v)] = len(names)
        lines.append(format_instruction(v, names))
    return "\n".join(lines)


_LINE = re.compile(
    r"^(?:%(?P<dst>\d+)\s*=\s*)?(?P<op>[A-Za-z_]\w*)\.(?P<dtype>\w+)\[(?P<shape>[\d,\s]*)\]"
    r"(?P<rest>.*)$"
)
_ATTR = re.compile(r"(\w+)=(\([^)]*\)|\S+)")
_IN = re.compile(r"^\.in\s+(\d+)\s+(\w+)\[([\d,\s]*)\]$")


def _shape(text: str, where: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise ParseError(f"{where}: bad shape [{text}]") from None


def _dtype(name: str, where: str) -> dtypes.DType:
    if name not in dtypes.BY_NAME:
        raise ParseError(f"{where}: unknown dtype {name!r}")
    return dtypes.BY_NAME[name]


def _attr_value(text: str, where: str) -> Any:
    if text.startswith("("):
        try:
            with warnings.catch_warnings():  # e.g. "invalid decimal literal" for (1x)
                warnings.simplefilter("ignore", SyntaxWarning)
                v = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise ParseError(f"{where}: bad attribute value {text}") from None
        if not isinstance(v, tuple) or not all(isinstance(x, int) for x in v):
            raise ParseError(f"{where}: tuple attributes hold integers, got {text}")
        return v
    if text in ("True", "False"):
        return text == "True"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    raise ParseError(f"{where}: bad attribute value {text!r}")


def parse_program(text: str) -> Any:
    """Parse the text form; errors name the line and say what was expected."""
    from .program import Program

    name = ""
    inputs: dict[int, tuple[dtypes.DType, tuple[int, ...]]] = {}
    env: dict[int, Value] = {}
    outputs: list[Value] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split(";", 1)[0].strip()
        if not line:
            continue
        where = f"line {lineno} ({line!r})"
        if line.startswith(".name"):
            name = line[5:].strip()
            continue
        if line.startswith(".in"):
            m = _IN.match(line)
            if not m:
                raise ParseError(f"{where}: expected '.in <index> <dtype>[<shape>]'")
            inputs[int(m[1])] = (_dtype(m[2], where), _shape(m[3], where))
            continue
        m = _LINE.match(line)
        if not m:
            raise ParseError(f"{where}: expected '%N = op.dtype[shape] operands attrs'")
        opname = m["op"].lower()
        if opname not in OPS:
            raise ParseError(f"{where}: unknown opcode {m['op']!r}")
        op = OPS[opname]
        rest = m["rest"].strip()
        first_attr = re.search(r"\b\w+=", rest)
        operand_text = rest[: first_attr.start()] if first_attr else rest
        attr_text = rest[first_attr.start():] if first_attr else ""
        srcs = []
        for tok in (t.strip() for t in operand_text.split(",") if t.strip()):
            if not re.fullmatch(r"%\d+", tok):
                raise ParseError(f"{where}: bad operand {tok!r}")
            k = int(tok[1:])
            if k not in env:
                raise ParseError(f"{where}: operand {tok} used before its definition")
            srcs.append(env[k])
        attrs = tuple((k, _attr_value(v, where)) for k, v in _ATTR.findall(attr_text))
        leftover = _ATTR.sub("", attr_text).strip()
        if leftover:
            raise ParseError(f"{where}: cannot read {leftover!r}")
        if op is Op.CONST:
            d = _dtype(m["dtype"], where)
            try:
                attrs = tuple((k, _const_value(v, d)) if k == "value" else (k, v)
                              for k, v in attrs)
            except (OverflowError, ValueError):  # inf or nan for an integer dtype
                raise ParseError(f"{where}: value is not representable as {d}") from None
        v = Value(op, _dtype(m["dtype"], where), _shape(m["shape"], where), tuple(srcs), attrs)
        if op is Op.STG:
            if m["dst"] is not None:
                raise ParseError(f"{where}: stg produces no value")
            outputs.append(v)
        else:
            if m["dst"] is None:
                raise ParseError(f"{where}: {op} must be assigned to a %number")
            dst = int(m["dst"])
            if dst in env:
                raise ParseError(f"{where}: %{dst} is defined twice")
            env[dst] = v
    if sorted(inputs) != list(range(len(inputs))):
        raise ParseError(f"inputs must be numbered 0..{len(inputs) - 1}, got {sorted(inputs)}")
    return Program(outputs, [inputs[i] for i in range(len(inputs))], name=name)


def _const_value(v: Any, d: dtypes.DType) -> Any:
    """Constants are stored in the Python type of their dtype, so 1 and 1.0 intern alike."""
    if isinstance(v, tuple):
        return v
    if d.kind == "f":
        return float(v)
    if d.kind == "b":
        return bool(v)
    return int(v)
