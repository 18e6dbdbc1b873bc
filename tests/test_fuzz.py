"""Fuzzing the parser and the handle API: whatever text, bytes, JSON or handles come in,
the only exceptions out are hologram's own (subclasses of HologramError).

Example counts come from the hypothesis profile (tests/conftest.py): "ci" by default,
HYPOTHESIS_PROFILE=long for the figures in docs/reliability.md.
"""

from __future__ import annotations

import inspect
import json
import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import hologram
from hologram import ffi
from hologram.errors import HologramError, ParseError, VerifyError
from hologram.isa import Op
from hologram.isa import builder as b
from hologram.isa.dtypes import BY_NAME as DTYPES

# --- a corpus of valid programs to mutate ---------------------------------------------


def _valid_programs() -> list[str]:
    specs = [("f32", (4, 3))]
    progs = [
        b.program(lambda x: (x * 2.0 + 1.0).exp(), specs),
        b.program(lambda x: x.sum(axis=1, keepdims=True) + x, specs),
        b.program(lambda x: (x < 0.5).where(x, -x).tanh(), specs),
        b.program(lambda x, y: x.maximum(y) / (y + 3.0), [("f32", (5,)), ("f32", (5,))]),
        b.program(lambda x, y: x @ y, [("f32", (2, 3)), ("f32", (3, 4))]),
        b.program(lambda x: x.permute((1, 0)).reshape((12,)).sigmoid(), specs),
        b.program(lambda x: x.cast("f64").sqrt(), [("f32", (6,))]),
    ]
    text = [str(p) for p in progs]
    text.append(".in 0 f32[3072]\n%0 = ldg.f32[3072] phi=(2,0,0)\n%1 = neg.f32[3072] %0\n"
                "stg.f32[3072] %1 out=0")
    text.append(".name k\n.in 0 i32[7]\n%0 = ldg.i32[7] in=0 ; load\n"
                "%1 = const.i32[7] value=3\n%2 = mul.i32[7] %0, %1\nstg.i32[7] %2 out=0")
    return text


VALID = _valid_programs()
OPCODES = [o.value for o in Op]
DTYPE_NAMES = sorted(DTYPES)


def parse_or_hologram_error(text: str) -> hologram.Program | None:
    """Parse; a program that parses must verify or raise VerifyError, and a verified one
    must print and parse back to the same program."""
    try:
        p = hologram.Program.parse(text)
    except ParseError:
        return None
    except VerifyError:  # the parser may build a value whose rules fail
        return None
    try:
        p.verify()
    except VerifyError:
        return None
    again = hologram.Program.parse(str(p))
    assert again.hash == p.hash
    return p


def test_corpus_is_valid() -> None:
    for t in VALID:
        assert parse_or_hologram_error(t) is not None, t


@given(st.text(max_size=400))
def test_random_text(text: str) -> None:
    parse_or_hologram_error(text)


_TOKENS = st.sampled_from(
    ["%", "%0", "%1", "%2", "%99", "=", ".", ",", "[", "]", "(", ")", " ", "\n", ";", "in=",
     "out=", "phi=", "value=", "axes=", "perm=", ".in", ".name", "0", "1", "-1", "3",
     "1e999", "nan", "-inf", "True", "((1,),)", "(0,1)", "(1,0)", "(,)", "()", "x", "\x00",
     "\u00e9", "\t", "99999999999999999999"]
    + OPCODES + DTYPE_NAMES + [f"{o}.{d}" for o in ("ldg", "stg", "add", "const")
                               for d in ("f32", "i32", "bool")]
)


@given(st.lists(st.lists(_TOKENS, max_size=14).map("".join), max_size=12).map("\n".join))
def test_token_soup(text: str) -> None:
    parse_or_hologram_error(text)


# --- mutations of valid programs ------------------------------------------------------
_NUMBERS = st.one_of(
    st.integers(-3, 40), st.sampled_from([-(2**63), 2**31, 2**64, 10**30, 0, 95, 96, 48, 256]),
).map(str)


@st.composite
def mutated(draw, max_mutations: int = 4) -> str:
    lines = draw(st.sampled_from(VALID)).split("\n")
    for _ in range(draw(st.integers(1, max_mutations))):
        kind = draw(st.sampled_from(["drop", "dup", "swap", "number", "opcode", "dtype",
                                     "shape", "attr", "chars", "operand"]))
        i = draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        if kind == "drop" and len(lines) > 1:
            del lines[i]
        elif kind == "dup":
            lines.insert(draw(st.integers(0, len(lines))), line)
        elif kind == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], line
        elif kind == "number":
            digits = [k for k, c in enumerate(line) if c.isdigit()]
            if digits:
                k = draw(st.sampled_from(digits))
                lines[i] = line[:k] + draw(_NUMBERS) + line[k + 1:]
        elif kind == "opcode":
            for o in OPCODES:
                if f" {o}." in f" {line}" or line.startswith(f"{o}."):
                    lines[i] = line.replace(f"{o}.", draw(st.sampled_from(OPCODES)) + ".", 1)
                    break
        elif kind == "dtype":
            for d in DTYPE_NAMES:
                if f".{d}[" in line or f" {d}[" in line:
                    new = draw(st.sampled_from([*DTYPE_NAMES, "f31", "", "F32", "f32x"]))
                    lines[i] = line.replace(f"{d}[", f"{new}[", 1)
                    break
        elif kind == "shape" and "[" in line:
            a, rest = line.split("[", 1)
            if "]" in rest:
                dims = draw(st.lists(_NUMBERS, max_size=4))
                lines[i] = a + "[" + ",".join(dims) + "]" + rest.split("]", 1)[1]
        elif kind == "attr":
            lines[i] = line + " " + draw(st.sampled_from(
                ["in=0", "in=7", "out=1", "out=-1", "phi=(1,2)", "phi=(96,0,0)", "phi=(0,48,0)",
                 "value=x", "value=1e999", "axes=(5,)", "axes=(1,0)", "axes=(0,0)",
                 "perm=(0,0)", "perm=(2,1,0)", "value=(1,2)", "phi=((1,),2,3)", "k=",
                 "in=True", "axes=()", "value=nan"]))
        elif kind == "chars":
            k = draw(st.integers(0, len(line)))
            lines[i] = line[:k] + draw(st.text(max_size=4)) + line[k:]
        elif kind == "operand" and "%" in line:
            lines[i] = line.replace("%", "%" + draw(st.sampled_from(["9", "1", "", "-", "%"])),
                                    1)
    return "\n".join(lines)


@given(mutated())
def test_mutated_programs(text: str) -> None:
    parse_or_hologram_error(text)


@given(mutated(max_mutations=1))
def test_mutated_programs_compile_or_raise(text: str) -> None:
    """A mutated program that verifies also compiles on the reference backend (or says
    why not with a hologram error); nothing else escapes."""
    p = parse_or_hologram_error(text)
    assume(p is not None)
    assume(all(math.prod(v.shape) <= 4096 for v in p.instructions))
    ex = _reference()
    try:
        ex.compile(p)
    except HologramError:
        pass


_REF: list[hologram.Executor] = []


def _reference() -> hologram.Executor:
    if not _REF:
        _REF.append(hologram.Executor("reference"))
    return _REF[0]


# --- the handle API -------------------------------------------------------------------
ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(),
    st.text(max_size=20), st.binary(max_size=40), st.lists(st.integers(), max_size=3),
    st.just(np.int64(1)), st.just(np.float32(1.0)), st.just(object()), st.just(1j),
    st.just(np.zeros(3, np.float32)), st.just(memoryview(b"\x00" * 8)),
)


@pytest.fixture(scope="module")
def handles():
    ex = ffi.new_executor_with_backend("cpu")
    other = ffi.new_executor_with_backend("cpu")
    bufs = [ffi.executor_allocate_buffer(ex, n) for n in (0, 1, 4, 16)]
    foreign = ffi.executor_allocate_buffer(other, 4)
    dead = ffi.executor_allocate_buffer(ex, 4)
    ffi.buffer_cleanup(dead)
    yield ex, bufs, foreign, dead
    ffi.executor_cleanup(ex)
    ffi.executor_cleanup(other)


def _refused(fn, *args) -> bool:
    """True when the call raised a hologram error; any other exception fails the test."""
    try:
        fn(*args)
    except HologramError:
        return True
    return False


API = [name for name in ffi.__all__ if name not in ("OP_NAMES", "clear_all_registries",
                                                     "new_executor", "new_executor_auto",
                                                     "new_executor_with_backend")]


@given(st.sampled_from(API), st.data())
def test_handle_api_random_arguments(handles, name: str, data) -> None:
    ex, bufs, foreign, dead = handles
    fn = getattr(ffi, name)
    params = list(inspect.signature(fn).parameters.values())
    pool = st.one_of(ANYTHING, st.sampled_from([ex, *bufs, foreign, dead, 0, -1, 10**9]))
    args = []
    for p in params:
        if p.name == "exec_handle" and data.draw(st.booleans()):
            args.append(ex)  # mostly the right executor, so deeper checks get exercised
        elif p.default is not inspect.Parameter.empty and data.draw(st.booleans()):
            break
        else:
            args.append(data.draw(pool))
    first = args[0] if args else None
    if name in ("executor_cleanup", "buffer_cleanup") and isinstance(
            first, (int, np.integer)) and not isinstance(first, (bool, np.bool_)) and int(
            first) in (ex, *bufs):
        return  # would tear down the fixture
    try:
        fn(*args)
    except HologramError:
        pass
    except TypeError as e:  # Python's own: a required argument left out
        assert len(args) < len(params) and "missing" in str(e), e


@given(st.one_of(st.text(max_size=200), st.binary(max_size=200),
                 st.lists(st.one_of(st.floats(), st.integers(-(2**80), 2**80), st.booleans(),
                                    st.none(), st.text(max_size=3)), max_size=20)
                 .map(json.dumps),
                 st.recursive(st.one_of(st.floats(), st.integers(), st.none()),
                              lambda c: st.lists(c, max_size=3) | st.dictionaries(
                                  st.text(max_size=3), c, max_size=3), max_leaves=10)
                 .map(json.dumps)))
def test_json_transfer_random_text(handles, text) -> None:
    ex, bufs, _, _ = handles
    for h in bufs:
        if _refused(ffi.buffer_copy_from_slice, ex, h, text):
            continue
        values = json.loads(ffi.buffer_to_vec(ex, h))
        assert len(values) == ffi.buffer_length(h)


@given(st.binary(max_size=80))
def test_bytes_transfer_random_bytes(handles, data: bytes) -> None:
    ex, bufs, _, _ = handles
    for h in bufs:
        before = ffi.buffer_to_bytes(ex, h)
        if _refused(ffi.buffer_copy_from_bytes, ex, h, data):
            assert ffi.buffer_to_bytes(ex, h) == before  # a refused write changes nothing
            continue
        after = ffi.buffer_to_bytes(ex, h)
        assert after[: len(data)] == data and after[len(data):] == before[len(data):]
