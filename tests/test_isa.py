"""The Atlas ISA: dtypes table, hash-consing, text round-trip, verifier errors."""

from __future__ import annotations

import numpy as np
import pytest

from hologram.backends.reference import evaluate
from hologram.errors import ParseError, VerifyError
from hologram.isa import Op, Program, Value, dtypes
from hologram.isa import builder as b
from hologram.isa.opcodes import BITWISE, GROUP, SHIFT, Group, arity


def test_dtype_table_rows_are_consistent():
    for d in dtypes.ALL:
        assert d.itemsize * 8 == d.bits
        if d.np_dtype is not None:
            assert d.np_dtype.itemsize == d.itemsize
            assert dtypes.to_dtype(d.np_dtype) is d
        assert dtypes.from_dlpack_code(d.dlpack_code, d.bits) is d
    assert dtypes.to_dtype("float32") is dtypes.f32
    assert dtypes.to_dtype(np.float64) is dtypes.f64
    with pytest.raises(TypeError, match="dtype"):
        dtypes.to_dtype(np.complex64)


def test_every_opcode_has_a_group_and_arity():
    for op in Op:
        assert op in GROUP
        varying = GROUP[op] in (Group.CONCAT, Group.ATTENTION)  # counted by the group's rule
        assert arity(op) is None if varying else arity(op) >= 0


def test_hash_consing_shares_identical_instructions():
    x = b.ldg(0, "f32", (4,))
    y = b.ldg(0, "f32", (4,))
    assert x is y
    assert b.elementwise(Op.ADD, x, y) is b.elementwise(Op.ADD, y, x)
    assert b.const(float("nan"), "f32", (4,)) is b.const(float("nan"), "f32", (4,))
    assert b.const(0.0, "f32", ()) is not b.const(-0.0, "f32", ())


def _every_op_program() -> Program:
    """One program that uses every opcode at least once."""
    f32 = dtypes.f32
    x = b.ldg(0, f32, (2, 3))
    y = b.ldg(1, f32, (2, 3))
    m = b.ldg(2, f32, (3, 4))
    p = b.ldg_phi((5, 1, 16), f32, (2, 3))
    vals = [x, y, p]
    i, j = b.cast(x, "i32"), b.cast(y, "i32")  # the bitwise ops and shifts take integers
    for op in Op:
        g = GROUP[op]
        u, v = (i, j) if op in BITWISE | SHIFT else (x, y)
        if g is Group.UNARY:
            vals.append(b.unary(op, u))
        elif g in (Group.BINARY, Group.COMPARE):
            vals.append(b.elementwise(op, u, v))
    cond = b.elementwise(Op.CMPLT, x, y)
    vals += [
        b.elementwise(Op.MAD, x, y, p),
        b.elementwise(Op.FMA, x, y, p),
        b.elementwise(Op.SEL, cond, x, y),
        b.cast(x, "f64"),
        b.const(float("-inf"), f32, (2, 3)),
        b.const(-0.0, f32, (2, 3)),
        b.const(float("nan"), f32, (2, 3)),
    ]
    for op in (Op.RSUM, Op.RMAX, Op.RMIN, Op.RPROD):
        vals.append(b.reduce(op, x, 1, keepdims=True))
    vals += [b.reshape(x, (3, 2)), b.expand(b.reduce(Op.RSUM, x, 0, True), (2, 3)),
             b.permute(x, (1, 0)), b.gemm(x, m), b.slice(x, (1, 0), (1, 2)),
             b.concat([x, y, p], 1)]
    out, lse = b.attention(x, y, p, b.reshape(b.gemm(x, b.permute(y, (1, 0))), (2, 2)),
                           causal=True)
    vals += [out, lse, *b.attention_grads(y, x, y, p, out, lse, scale=0.5)]
    idx = b.cast(b.iota((2, 3), 1, "i64"), "i32")
    vals += [b.iota((2, 3), 0, f32), b.gather(x, idx, 1), b.scatter(x, idx, y, 1),
             b.scatter_add(x, idx, y, 0), b.cumsum(x, 1), b.cumprod(x, 0),
             *(b.scatter_combine(x, idx, y, 1, step) for step in (Op.MUL, Op.MAX, Op.MIN)),
             b.argsort(x, 1), b.argsort(x, 0, descending=True, dtype="i32")]
    outs = [b.stg(v, i) for i, v in enumerate(vals)]
    outs.append(b.stg_phi(x, (7, 0, 0)))
    return Program(outs, [(f32, (2, 3)), (f32, (2, 3)), (f32, (3, 4))], name="every_op")


def test_every_opcode_appears_and_round_trips_through_text():
    p = _every_op_program()
    p.verify()
    assert {v.op for v in p.instructions} == set(Op)
    text = str(p)
    assert "%3 = " in text and "add.f32[2,3]" in text
    q = Program.parse(text)
    assert q == p
    assert q.hash == p.hash
    assert str(q) == text


@pytest.mark.parametrize("op", [op for op in Op if GROUP[op] in (Group.UNARY, Group.BINARY)])
def test_single_op_round_trip(op):
    n = arity(op)
    d = "i64" if op in BITWISE | SHIFT else "f64"
    p = b.program(lambda *xs: Value(op, xs[0].dtype, xs[0].shape, tuple(x.v for x in xs)),
                  [(d, (5,))] * n)
    assert Program.parse(str(p)) == p


@pytest.mark.parametrize("d", [d.name for d in dtypes.INTEGERS])
def test_integer_dtypes_round_trip_and_constants_stay_in_range(d):
    """Every integer dtype prints and parses back (its limits as constants too); a
    constant outside the dtype's range (-1 as a uint8) is a VerifyError naming both."""
    info = np.iinfo(dtypes.BY_NAME[d].np_dtype)
    p = b.program(lambda x: (x * b.const(int(info.max), d) + b.const(int(info.min), d)),
                  [(d, (3,))])
    assert Program.parse(str(p)) == p
    x = np.array([0, 1, info.max], info.dtype)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(evaluate(p, [x])[0][0], x * info.max + info.min)
    with pytest.raises(VerifyError, match=rf"value={int(info.min) - 1} is not a {d}"):
        b.const(int(info.min) - 1, d)
    with pytest.raises(VerifyError, match=rf"value={int(info.max) + 1} is not a {d}"):
        b.const(int(info.max) + 1, d)


def test_parse_reads_the_documented_example():
    p = Program.parse("""
        .in 0 f32[1024]
        %0 = ldg.f32[1024] in=0
        %1 = const.f32[1024] value=2
        %2 = mul.f32[1024] %0, %1   ; a comment
        stg.f32[1024] %2 out=0
    """)
    p.verify()
    assert p.instructions[1].attr("value") == 2.0


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("%0 = frob.f32[4] in=0", "unknown opcode 'frob'"),
        ("%1 = neg.f32[4] %0", "used before its definition"),
        ("%0 = ldg.f99[4] in=0", "unknown dtype"),
        ("%0 = ldg.f32[4] in=0\n%0 = neg.f32[4] %0", "defined twice"),
        ("garbage", "expected"),
        ("%0 = ldg.f32[4] in=zz(", "bad attribute"),
    ],
)
def test_parse_errors_name_the_line(text, fragment):
    with pytest.raises(ParseError, match="line") as e:
        Program.parse(".in 0 f32[4]\n" + text)
    assert fragment in str(e.value)


def _prog(lines: str, inputs="(('f32', (4,)), ('f32', (3,)))") -> Program:
    return Program.parse("\n".join([".in 0 f32[4]", ".in 1 f32[3]", lines]))


@pytest.mark.parametrize(
    "lines, fragment",
    [
        # shape mismatch
        ("%0 = ldg.f32[4] in=0\n%1 = ldg.f32[3] in=1\n%2 = add.f32[4] %0, %1\n"
         "stg.f32[4] %2 out=0", "differ in shape"),
        # dtype mismatch
        ("%0 = ldg.f32[4] in=0\n%1 = cvt.f64[4] %0\n%2 = add.f32[4] %0, %1\nstg.f32[4] %2 out=0",
         "differ in dtype"),
        # declared shape wrong
        ("%0 = ldg.f32[4] in=0\n%1 = neg.f32[5] %0\nstg.f32[5] %1 out=0", "declared shape"),
        # bad axis
        ("%0 = ldg.f32[4] in=0\n%1 = rsum.f32[1] %0 axes=(2,)\nstg.f32[1] %1 out=0",
         "out of range"),
        # input declared differently
        ("%0 = ldg.f32[5] in=0\nstg.f32[5] %0 out=0", "declared"),
        # input index out of range
        ("%0 = ldg.f32[4] in=7\nstg.f32[4] %0 out=0", "out of range"),
        # float-only op on ints
        ("%0 = ldg.f32[4] in=0\n%1 = cvt.i32[4] %0\n%2 = exp.i32[4] %1\nstg.i32[4] %2 out=0",
         "floating-point"),
        # bitwise ops and shifts on floats, shifts on bool
        ("%0 = ldg.f32[4] in=0\n%1 = xor.f32[4] %0, %0\nstg.f32[4] %1 out=0",
         "xor is a bitwise op: it needs an integer or bool dtype, got f32"),
        ("%0 = ldg.f32[4] in=0\n%1 = not.f32[4] %0\nstg.f32[4] %1 out=0",
         "not is a bitwise op"),
        ("%0 = ldg.f32[4] in=0\n%1 = shl.f32[4] %0, %0\nstg.f32[4] %1 out=0",
         "shl is a shift: it needs an integer dtype, got f32"),
        ("%0 = ldg.f32[4] in=0\n%1 = cmplt.bool[4] %0, %0\n%2 = shr.bool[4] %1, %1\n"
         "stg.bool[4] %2 out=0", "shr is a shift: it needs an integer dtype, got bool"),
        ("%0 = ldg.f32[4] in=0\n%1 = cmplt.bool[4] %0, %0\n%2 = add.bool[4] %1, %1\n"
         "stg.bool[4] %2 out=0", "add is not defined on bool"),
        # bad phi
        ("%0 = ldg.f32[4] phi=(96,0,0)\nstg.f32[4] %0 out=0", "phi class"),
        # reshape changes size
        ("%0 = ldg.f32[4] in=0\n%1 = reshape.f32[5] %0\nstg.f32[5] %1 out=0", "changes the size"),
        # gemm inner mismatch
        ("%0 = ldg.f32[4] in=0\n%1 = reshape.f32[2,2] %0\n%2 = ldg.f32[3] in=1\n"
         "%3 = reshape.f32[3,1] %2\n%4 = gemm.f32[2,1] %1, %3\nstg.f32[2,1] %4 out=0",
         "inner sizes"),
        # outputs numbered wrong
        ("%0 = ldg.f32[4] in=0\nstg.f32[4] %0 out=3", "output indices"),
    ],
)
def test_verifier_names_the_instruction(lines, fragment):
    p = _prog(lines)
    with pytest.raises(VerifyError) as e:
        p.verify()
    msg = str(e.value)
    assert fragment in msg
    if "output indices" not in fragment:
        assert any(t in msg for t in (".f", ".i", ".bool"))  # the instruction, as text


def test_builder_rejects_bad_instructions_eagerly():
    x = b.ldg(0, "f32", (4,))
    y = b.ldg(1, "f32", (3,))
    with pytest.raises(ValueError, match="broadcast"):
        b.elementwise(Op.ADD, x, y)
    with pytest.raises(VerifyError, match="out of range"):
        b.reduce(Op.RSUM, x, 3)
    with pytest.raises(VerifyError, match="dtype"):
        b.Var(x) + b.Var(b.cast(x, "f64"))


def test_broadcasting_is_explicit_reshape_and_expand():
    p = b.program(lambda x, y: x + y, [("f32", (3, 4)), ("f32", (4,))])
    ops = [v.op for v in p.instructions]
    assert Op.RESHAPE in ops and Op.EXPAND in ops


# --- batched GEMM ---------------------------------------------------------------------------
@pytest.mark.parametrize("sa, sb, want", [
    ((3, 4), (4, 5), (3, 5)),
    ((2, 3, 4), (2, 4, 5), (2, 3, 5)),
    ((2, 6, 3, 4), (2, 6, 4, 5), (2, 6, 3, 5)),
    ((0, 3, 4), (0, 4, 5), (0, 3, 5)),  # an empty batch
    ((2, 3, 0), (2, 0, 5), (2, 3, 5)),  # k = 0: zeros
    ((2, 0, 4), (2, 4, 0), (2, 0, 0)),
])
def test_gemm_takes_equal_batch_dims(sa, sb, want):
    x, y = b.ldg(0, "f64", sa), b.ldg(1, "f64", sb)
    g = b.gemm(x, y)
    assert g.shape == want and g.dtype is dtypes.f64
    p = Program([b.stg(g, 0)], [(dtypes.f64, sa), (dtypes.f64, sb)])
    p.verify()
    assert Program.parse(str(p)) == p  # the text form carries the batch


@pytest.mark.parametrize("sa, sb, fragment", [
    ((4,), (4, 5), "rank >= 2"),
    ((3, 4), (4,), "rank >= 2"),
    ((2, 3, 4), (4, 5), "differ in rank"),
    ((2, 3, 4), (3, 4, 5), "batch dims differ: [2] vs [3]"),
    ((1, 3, 4), (2, 4, 5), "batch dims differ"),  # no implicit broadcast: EXPAND first
    ((2, 3, 4), (2, 5, 6), "inner sizes differ"),
])
def test_gemm_rejects_bad_ranks_and_sizes(sa, sb, fragment):
    x, y = b.ldg(0, "f32", sa), b.ldg(1, "f32", sb)
    with pytest.raises(VerifyError, match="gemm") as e:
        b.gemm(x, y)
    assert fragment in str(e.value)


def test_gemm_rejects_integer_operands():
    x = b.cast(b.ldg(0, "f32", (2, 3, 4)), "i32")
    with pytest.raises(VerifyError, match="floating-point"):
        b.gemm(x, b.permute(x, (0, 2, 1)))


def test_verifier_names_a_bad_batched_gemm():
    p = Program.parse("\n".join([
        ".in 0 f32[2,3,4]", ".in 1 f32[3,4,5]",
        "%0 = ldg.f32[2,3,4] in=0", "%1 = ldg.f32[3,4,5] in=1",
        "%2 = gemm.f32[2,3,5] %0, %1", "stg.f32[2,3,5] %2 out=0"]))
    with pytest.raises(VerifyError, match=r"gemm\.f32\[2,3,5\].*batch dims differ"):
        p.verify()


@pytest.mark.parametrize("sa, sb", [
    ((3, 4), (4, 5)), ((4,), (4,)), ((4,), (4, 5)), ((3, 4), (4,)), ((2, 3, 4), (4,)),
    ((4,), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((5, 4, 2), (2, 6)), ((0, 3, 4), (4, 2)),
])
def test_matmul_follows_numpy_with_explicit_expand(sa, sb):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(sa), rng.standard_normal(sb)
    p = b.program(lambda u, v: u @ v, [("f64", sa), ("f64", sb)])
    got = evaluate(p, [x, y])[0][0]
    want = np.matmul(x, y)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    (g,) = [v for v in p.instructions if v.op is Op.GEMM]
    assert g.srcs[0].shape[:-2] == g.srcs[1].shape[:-2]  # the batch was expanded first


def test_matmul_rejects_what_numpy_rejects():
    x = b.ldg(0, "f32", (2, 3, 4))
    with pytest.raises(ValueError, match="inner sizes"):
        b.matmul(x, b.ldg(1, "f32", (3, 5)))
    with pytest.raises(ValueError, match="broadcast"):
        b.matmul(x, b.ldg(1, "f32", (3, 4, 5)))
    with pytest.raises(ValueError, match="rank >= 1"):
        b.matmul(x, b.ldg(1, "f32", ()))
