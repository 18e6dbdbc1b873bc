"""Canonical compilation: the rewrite engine, every rule (exact on NaN/inf/-0.0/denormal
inputs through the reference interpreter), canonical hashes, the loop guard."""

from __future__ import annotations

import subprocess
import sys
import time
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hologram.backends.reference import evaluate
from hologram.compiler import Pat, ReductionStats, RewriteLoopError, Rule, canonicalize, rewrite
from hologram.compiler.canonicalize import clear_cache
from hologram.compiler.rewrite import order_key, structural_key
from hologram.compiler.rules import ALL_RULES, CANONICAL_RULES, EXACT_RULES, POW_RULES
from hologram.errors import HologramError
from hologram.isa import Op, Program, dtypes
from hologram.isa import builder as b
from hologram.isa.builder import Var

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

S = (4, 8)
DTYPES = ["f32", "f64"]


# --------------------------------------------------------------------------- inputs and checks

def special_values(dtype: str) -> np.ndarray:
    t = np.dtype(np.float32 if dtype == "f32" else np.float64)
    fi = np.finfo(t)
    vals = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.0, 0.5, -0.5, 3.0,
            float(fi.smallest_subnormal), -float(fi.smallest_subnormal),
            float(fi.tiny) / 4, -float(fi.tiny) / 3, float(fi.tiny), float(fi.max),
            -float(fi.max), float(fi.eps), 1e-3, 7.25, -123.5]
    return np.array(vals, dtype=t)


def special_inputs(specs, seed: int) -> list[np.ndarray]:
    """Random inputs in which every special value (NaN, +-inf, +-0.0, denormals, ...)
    appears, in a different arrangement per input and seed."""
    rng = np.random.default_rng(seed)
    out = []
    for d, s in specs:
        d = dtypes.to_dtype(d)
        n = int(np.prod(s))
        sp = special_values(d.name)
        a = (rng.standard_normal(n) * 4).astype(d.np_dtype)
        k = min(n, len(sp))
        a[rng.permutation(n)[:k]] = rng.permutation(sp)[:k]
        mask = rng.random(n) < 0.2
        a[mask] = rng.choice(sp, size=int(mask.sum()))
        out.append(a.reshape(s))
    return out


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal values, NaN where NaN, and the same sign on every non-NaN (so -0.0 != 0.0).
    The sign of a NaN is not compared: no ISA instruction can observe it."""
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.array_equal(got, want, equal_nan=want.dtype.kind == "f")
    if want.dtype.kind == "f":
        live = ~np.isnan(want)
        assert np.array_equal(np.signbit(got[live]), np.signbit(want[live]))


def assert_equivalent(p: Program, q: Program, seeds=range(3)) -> None:
    for seed in seeds:
        ins = special_inputs(p.inputs, seed)
        want, _ = evaluate(p, ins)
        got, _ = evaluate(q, ins)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)


def const(value, dtype, shape=S) -> Var:
    return Var(b.const(value, dtype, shape))


def raw(op: Op, x: Var, shape=None, attrs=None) -> Var:
    """An instruction exactly as written (the builder would skip some no-ops)."""
    return Var(b.make(op, (x.v,), attrs, x.v.dtype, x.v.shape if shape is None else shape))


# --------------------------------------------------------------------------- one case per rule

def _fold_elementwise(d):
    def fn(x):
        c = const(2.0, d)
        folded = ((c * 3.0).exp() + c.sqrt() - (c < 3.0).where(c, -c)
                  + c.mad(c, c).sigmoid() + const(float("nan"), d).minimum(c))
        return x * folded, (c / 0.0) + x
    return b.program(fn, [(d, S)])


def _fold_cvt(d):
    other = "f64" if d == "f32" else "f32"
    return b.program(lambda x: x + Var(b.cast(b.const(0.1, other, S), d))
                     + Var(b.cast(b.const(7, "i32", S), d)), [(d, S)])


def _fold_movement(d):
    def fn(x):
        r = raw(Op.RESHAPE, Var(b.const(2.0, d, (32,))), shape=S)
        e = raw(Op.EXPAND, Var(b.const(-0.0, d, (1, 8))), shape=S)
        p = raw(Op.PERMUTE, Var(b.const(3.0, d, (8, 4))), attrs={"perm": (1, 0)})
        return x * r + e - p
    return b.program(fn, [(d, S)])


def _permute_permute(d):
    return b.program(lambda x, y: x.permute(1, 2, 0).permute(1, 0, 2) + y,
                     [(d, (2, 3, 4)), (d, (4, 3, 2))])


def _expand_expand(d):
    def fn(x, y):
        e = Var(b.make(Op.EXPAND, (x.v,), None, x.v.dtype, (1, 4, 8)))
        return Var(b.make(Op.EXPAND, (e.v,), None, x.v.dtype, (3, 4, 8))) + y
    return b.program(fn, [(d, (1, 1, 8)), (d, (3, 4, 8))])


def _empty_value(d):
    # every kind of computed value of size 0: element-wise, cast, reduction, views, concat
    def fn(x, y):
        e = (x.exp() * y + 1.0).sqrt()
        return (e, x.cast("f64" if d == "f32" else "f32"), x.sum(1, keepdims=True),
                x.T.reshape(8, 0), Var(b.concat([x.v, x.v], 0)), x.slice((0, 2), (0, 3)))
    return b.program(fn, [(d, (0, 8)), (d, (1, 8))])


def _empty_reduce(d):
    # each reduction over no elements: its identity, broadcast into a non-empty result
    return b.program(lambda x, y: (x.sum(0, keepdims=True) + y, x.max(0) * 1.0 + y,
                                   x.min(0) + y, x.prod(0) + y), [(d, (0, 8)), (d, (8,))])


def _empty_gemm(d):
    return b.program(lambda x, y: x @ y + 1.0, [(d, (4, 0)), (d, (0, 8))])


def _empty_concat_part(d):
    return b.program(lambda x, y, z: (Var(b.concat([x.v, y.v, x.v], 0)).exp(),
                                      Var(b.concat([x.v, y.v, z.v], 0)) * 2.0),
                     [(d, (0, 8)), (d, S), (d, (3, 8))])


def _index_empty(d):
    # an iota, gather and scans with no elements; the gather reads an empty index
    def fn(x, y):
        idx = Var(b.iota((0, 8), 0, "i64"))
        return (x + Var(b.iota((0, 8), 1, d)), Var(b.gather(y.v, idx.v, 0)),
                Var(b.cumsum(x.v, 0)), Var(b.cumprod(x.v, 1)))
    return b.program(fn, [(d, (0, 8)), (d, S)])


def _iota_unit_axis(d):
    return b.program(lambda x: x * Var(b.iota((4, 1), 1, d)) + Var(b.iota((4, 8), 0, d)),
                     [(d, (4, 1))])


def _scan_unit_axis(d):
    return b.program(lambda x: (Var(b.cumsum(x.v, 0)), Var(b.cumprod(x.v, 0))), [(d, (1, 8))])


def _scatter_empty_src(d):
    def fn(x, y):
        idx = Var(b.iota((0, 8), 0, "i32"))
        return (Var(b.scatter_add(x.v, idx.v, y.v, 0)) * 2.0,
                Var(b.scatter(x.v, idx.v, y.v, 0)))
    return b.program(fn, [(d, S), (d, (0, 8))])


def _cvt_iota(d):
    # i32 -> float and float -> i64 iotas; the last is too long for f16 and stays a cvt
    def fn(x):
        io = Var(b.iota(S, 1, "i32")).cast(d)
        back = Var(b.iota(S, 0, d)).cast("i64").cast(d)
        return x * io + back, Var(b.iota((3000,), 0, "i32")).cast("f16").cast(d)
    return b.program(fn, [(d, S)])


def _round_integral(d):
    # pooling's window starts: an iota's affine map rounded (ceil of -(2 o - 1), clamped,
    # floored again), a bool cast and floor(x) shifted by integral constants; and a
    # rounding of a non-integral value (x * 0.5) that must stay
    def fn(x, y):
        start = Var(b.iota(S, 1, "i32")).cast(d) * 2.0 - 1.0
        r = lambda op, v: Var(b.unary(op, v.v))  # noqa: E731
        lo = r(Op.CEIL, -start).maximum(const(0.0, d)) + start
        hit = (x < y).cast(d) * 3.0
        return (r(Op.FLOOR, lo) * x, r(Op.TRUNC, hit - 1.0) + y,
                r(Op.RINT, r(Op.FLOOR, x) + 2.0), r(Op.CEIL, x * 0.5))
    return b.program(fn, [(d, S), (d, S)])


def _neg(x: Var) -> Var:
    return -x


def _attention(q, k, v, scales=(-0.5,)):
    """Forward and backward of attention over q, k, v of these shapes, once per scale."""
    def make(d):
        def fn(q, k, v, dout):
            outs = []
            for s in scales:
                out, lse = b.attention(q.v, k.v, v.v, scale=s, causal=True)
                outs += [out, lse, *b.attention_grads(dout.v, q.v, k.v, v.v, out, lse,
                                                      scale=s, causal=True)]
            return tuple(Var(x) for x in outs)
        return b.program(fn, [(d, q), (d, k), (d, v), (d, (*q[:-1], v[-1]))])
    return make


def _sink_permute(d):
    # a permuted input through a bias add, a constant, a same-permuted second operand,
    # and a unary op; then permuted back (the permutes must cancel)
    def fn(x, y, bias):
        t = x.permute(1, 0, 2)  # [3, 2, 4]
        u = ((t + bias.reshape(1, 1, 4).expand((3, 2, 4))) * 0.5).exp() * y.permute(1, 0, 2)
        return u.permute(1, 0, 2), u - 1.0
    return b.program(fn, [(d, (2, 3, 4)), (d, (2, 3, 4)), (d, (4,))])


def _sink_split_reshape(d):
    # a [4, 8] product-like value read as [4, 2, 2, 2] through a bias broadcast per row,
    # a constant and a unary op; and a broadcast that does not split alike (declined)
    def fn(x, bias, col):
        r = x.reshape(4, 2, 2, 2)
        y = ((r + bias.reshape(4, 1, 1, 1).expand((4, 2, 2, 2))) * 2.0).tanh()
        z = r * col.reshape(1, 1, 2, 1).expand((4, 2, 2, 2))
        return y, z
    return b.program(fn, [(d, S), (d, (4,)), (d, (2,))])


def _bsel(c, p, q):
    """``c ? p : q`` on bool operands, either branch a Python bool (a constant)."""
    def lift(v):
        return b.const(v, dtypes.boolean, ()) if isinstance(v, bool) else v.v
    return Var(b.elementwise(Op.SEL, c.v, lift(p), lift(q)))


def _prog(fn, n=1):
    return lambda d: b.program(fn, [(d, S)] * n)


CASES = {
    "empty_value": _empty_value,
    "empty_reduce": _empty_reduce,
    "empty_gemm": _empty_gemm,
    "empty_concat_part": _empty_concat_part,
    "empty_attention": _attention((2, 0, 4), (2, 3, 4), (2, 3, 5)),
    "attention_no_keys_or_queries": _attention((2, 3, 4), (2, 0, 4), (2, 0, 5),
                                               (-0.5, 2.0, float("nan"), float("inf"))),
    "attention_unit_features": _attention((2, 3, 0), (2, 4, 0), (2, 4, 5), (0.5, -1.0)),
    "fold_elementwise": _fold_elementwise,
    "fold_cvt": _fold_cvt,
    "fold_movement": _fold_movement,
    "add_neg_zero": _prog(lambda x: x + -0.0),
    "sub_zero": _prog(lambda x: x - 0.0),
    "mul_one": _prog(lambda x: x * 1.0),
    "div_one": _prog(lambda x: x / 1.0),
    "mul_neg_one": _prog(lambda x: x * -1.0),
    "neg_neg": _prog(lambda x: _neg(_neg(x))),
    "abs_abs": _prog(lambda x: abs(abs(x))),
    "abs_neg": _prog(lambda x: abs(-x)),
    "minmax_same": _prog(lambda x: (x.minimum(x), x.maximum(x))),
    "sel_same": _prog(lambda x, y: (x < y).where(y, y), 2),
    # logic as selects (how lowering.context spells or_/and_/not_), NaNs included by
    # assert_equivalent's inputs: ATen's max-pool rule `t > best | isnan(t)`
    "sel_not": _prog(lambda x, y: _bsel(x < y, False, True).where(x, y), 2),
    "sel_or": _prog(lambda x, y: _bsel(x < y, True, x.eq(x)).where(x, y), 2),
    "sel_and": _prog(lambda x, y: _bsel(x < y, x.eq(x), False).where(x, y), 2),
    "round_integral": _round_integral,
    "reshape_same": _prog(lambda x: raw(Op.RESHAPE, x) * 3.0),
    "reshape_reshape": _prog(lambda x: x.reshape(8, 4).reshape(2, 16).exp()),
    "permute_identity": _prog(lambda x: raw(Op.PERMUTE, x, attrs={"perm": (0, 1)}) - 1.0),
    "permute_permute": _permute_permute,
    "expand_same": _prog(lambda x: raw(Op.EXPAND, x).sqrt()),
    "expand_expand": _expand_expand,
    "order_commutative": _prog(lambda x, y: (2.0 + x, 0.5 * y, Var(b.elementwise(
        Op.CMPEQ, b.const(0.0, x.dtype, S), x.v))), 2),
    "order_mad_factors": _prog(lambda x, y: Var(b.const(3.0, x.dtype, S)).mad(x, y), 2),
    "order_minmax_const": _prog(lambda x: (const(3.0, x.dtype).minimum(x),
                                           const(float("nan"), x.dtype).maximum(x),
                                           const(-2.5, x.dtype).maximum(x))),
    "div_pow2": _prog(lambda x, y: (x / 4.0, y / -0.5, x / 2.0 ** -60), 2),
    "mul_add_to_mad": _prog(lambda x, y, z: (x * y + z, z + y * x), 3),
    "index_empty": _index_empty,
    "iota_unit_axis": _iota_unit_axis,
    "scan_unit_axis": _scan_unit_axis,
    "scatter_empty_src": _scatter_empty_src,
    "cvt_iota": _cvt_iota,
    "sink_permute": _sink_permute,
    "sink_split_reshape": _sink_split_reshape,
    "pow_one": _prog(lambda x: x ** 1.0),
    "pow_two": _prog(lambda x: x ** 2.0),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule", EXACT_RULES, ids=lambda r: r.name)
def test_rule_fires_and_is_exact(rule, dtype):
    assert rule.name in CASES, f"rule {rule.name} has no test case in CASES"
    p = CASES[rule.name](dtype).verify()
    q, st_ = canonicalize(p)
    assert st_.rules.get(rule.name, 0) >= 1, st_
    assert q.inputs == p.inputs
    q.verify()
    assert_equivalent(p, q)


def test_only_integral_values_lose_their_rounding():
    """round_integral drops the three roundings of integral values and keeps
    ceil(x * 0.5), whose operand is not integral."""
    q, _ = canonicalize(_round_integral("f32").verify())
    rounding = [v for v in q.instructions
                if v.op in (Op.FLOOR, Op.CEIL, Op.TRUNC, Op.RINT)]
    assert [(v.op, v.srcs[0].op) for v in rounding] == [(Op.FLOOR, Op.LDG),
                                                        (Op.CEIL, Op.MUL)]


def test_sunk_permutes_cancel_and_split_reshapes_run_over_long_rows():
    """What the layout rules are for: a value permuted, worked on element-wise and
    permuted back has no permute left (no copy either way), and an element-wise op over
    a split reshape runs over the unsplit shape; a broadcast that does not split alike
    keeps its op where it was."""
    q, _ = canonicalize(_sink_permute("f32"))
    back = q.outputs[0]
    assert back.op is not Op.PERMUTE
    assert not any(v.op is Op.PERMUTE and v.srcs[0].op not in (Op.EXPAND, Op.LDG)
                   for v in q.instructions if v.ndim == 3 and v.shape == (2, 3, 4))
    q, _ = canonicalize(_sink_split_reshape("f32"))
    assert [v.shape for v in q.instructions if v.op is Op.TANH] == [(4, 8)]
    assert [v.shape for v in q.instructions if v.op is Op.MUL and v.srcs[0].op is not Op.CONST
            and v.srcs[1].op is not Op.CONST] == [(4, 2, 2, 2)]


def _correct_pow(x: np.ndarray, n: int) -> np.ndarray:
    """pow(x, n) correctly rounded (what IEEE 754 recommends), via exact rationals."""
    out = np.empty_like(x)
    for i, v in enumerate(x.reshape(-1).tolist()):
        if not np.isfinite(v) or v == 0:
            with np.errstate(all="ignore"):
                out.flat[i] = v if n == 1 else v * v
            continue
        try:
            exact = float(Fraction(v) ** n)  # correctly rounded to f64
        except OverflowError:
            exact = float("inf")
        out.flat[i] = exact  # f32: the f64 square of an f32 is exact, one rounding
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule", POW_RULES, ids=lambda r: r.name)
def test_pow_rules(rule, dtype):
    """pow(x, 1) -> x and pow(x, 2) -> x*x give the correctly rounded pow bit for bit.
    NumPy's AVX-512 power is not correctly rounded: the reference agrees within a few ulp."""
    assert rule.name in CASES, f"rule {rule.name} has no test case in CASES"
    p = CASES[rule.name](dtype)
    q, st_ = canonicalize(p)
    assert st_.rules.get(rule.name, 0) >= 1
    assert not any(v.op is Op.POW for v in q.instructions)
    n = 1 if rule.name == "pow_one" else 2
    for seed in range(3):
        ins = special_inputs(p.inputs, seed)
        (got,), _ = evaluate(q, ins)
        assert_same(got, _correct_pow(ins[0], n))
        (ref,), _ = evaluate(p, ins)  # NumPy's pow: within a few ulp
        np.testing.assert_allclose(ref, got, rtol=8 * np.finfo(ref.dtype).eps, equal_nan=True)


def test_every_rule_has_a_unique_name_and_a_case():
    names = [r.name for r in ALL_RULES]
    assert len(names) == len(set(names))
    assert set(CASES) == set(names)


# --------------------------------------------------------------------------- canonical hashes

@pytest.mark.parametrize("dtype", DTYPES)
def test_three_forms_of_mad_have_one_canonical_hash(dtype):
    specs = [(dtype, S)] * 3
    forms = [
        b.program(lambda a, b_, c: a * b_ + c, specs),
        b.program(lambda a, b_, c: c + b_ * a, specs),
        b.program(lambda a, b_, c: (b_ * a) + c, specs),
    ]
    assert len({p.hash for p in forms}) == 3
    canon = [canonicalize(p)[0] for p in forms]
    assert len({c.hash for c in canon}) == 1
    assert canon[0] == canon[1] == canon[2]
    assert [v.op for v in canon[0].instructions].count(Op.MAD) == 1
    for p, c in zip(forms, canon, strict=True):
        assert_equivalent(p, c)


_CHILD = """
import numpy as np
from hologram.isa import builder as b
from hologram.compiler import canonicalize
junk = [b.const(float(i), "f32", (i,)) for i in range(1, 300)]  # shift object ids
p = b.program(lambda a, b_, c: (c.exp() + b_ * a, a.minimum(c) * 2.0 + (b_ + a)),
              [("f32", (4, 8))] * 3)
print(canonicalize(p)[0].hash)
"""


def test_canonical_hash_does_not_depend_on_ids_or_build_order():
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         check=True).stdout.strip()
    p = b.program(lambda a, b_, c: (a * b_ + c.exp(), (a + b_) + 2.0 * a.minimum(c)),
                  [("f32", (4, 8))] * 3)
    assert canonicalize(p)[0].hash == out


def test_structural_key_is_content_only():
    x, y = b.ldg(0, "f32", S), b.ldg(1, "f32", S)
    assert structural_key(b.const(0.0, "f32", S)) != structural_key(b.const(-0.0, "f32", S))
    assert structural_key(x) != structural_key(y)
    assert structural_key(b.make(Op.ADD, (x, y))) != structural_key(b.make(Op.ADD, (y, x)))
    c = b.const(1.0, "f32", S)
    assert sorted([c, x, y], key=order_key)[-1] is c  # constants last


# --------------------------------------------------------------------------- stats, cache

def test_stats_count_compute_instructions_and_dead_code():
    clear_cache()
    p = b.program(lambda x, y: (x * 1.0 + -0.0) / 2.0 + y, [("f32", S)] * 2)
    q, st_ = canonicalize(p)
    assert isinstance(st_, ReductionStats)
    assert st_.instructions_before == 7  # 3 consts, mul, add, div, add (no ldg/stg)
    assert st_.instructions_after == 2  # const 0.5, mad
    assert st_.removed == 5 and not st_.cached
    assert st_.rules["mul_one"] == 1 and st_.rules["add_neg_zero"] == 1
    assert st_.rules["div_pow2"] == 1 and st_.rules["mul_add_to_mad"] == 1
    assert st_.dead_code >= 3  # the constants 1.0, -0.0 and 2.0
    assert "7 -> 2" in str(st_) and "mul_one x1" in str(st_)
    assert_equivalent(p, q)


def test_cache_and_idempotence():
    clear_cache()
    p = b.program(lambda x, y: (y * x + 2.0 * x, _neg(_neg(y))), [("f64", S)] * 2)
    q, st1 = canonicalize(p)
    q2, st2 = canonicalize(p)
    assert q2 is q and st2.cached and st2.rules == st1.rules
    q3, st3 = canonicalize(q)
    assert q3.hash == q.hash and st3.instructions_before == st3.instructions_after
    fresh, st4 = canonicalize(q, rules=CANONICAL_RULES)  # bypasses the cache
    assert fresh.hash == q.hash and st4.fired == 0
    assert rewrite(q, CANONICAL_RULES) is q


def test_memory_instructions_and_output_order_are_preserved():
    x = b.ldg_phi((3, 2, 0), "f32", S)
    y = b.ldg(0, "f32", S)
    s1 = b.stg(b.make(Op.MUL, (y, b.const(1.0, "f32", S))), 1)
    s0 = b.stg_phi(b.make(Op.ADD, (b.const(-0.0, "f32", S), x)), (5, 1, 16))
    s2 = b.stg(b.make(Op.ADD, (x, y)), 0)
    p = Program([s1, s0, s2], [("f32", S)], name="mixed").verify()
    q, _ = canonicalize(p)
    assert q.inputs == p.inputs and q.name == "mixed"
    assert [o.attrs for o in q.outputs] == [o.attrs for o in p.outputs]
    assert q.outputs[0].srcs[0] is y and q.outputs[1].srcs[0] is x
    arena = np.zeros(96 * 48 * 256, np.uint8)
    arena[(3 * 48 + 2) * 256:][:128].view(np.float32)[:] = np.resize(special_values("f32"), 32)
    ins = special_inputs(p.inputs, 0)
    (w1, w0), wphi = evaluate(p, ins, arena)
    (g1, g0), gphi = evaluate(q, ins, arena)
    assert_same(g1, w1)
    assert_same(g0, w0)
    assert_same(gphi[0][1], wphi[0][1])
    assert gphi[0][0].attr("phi") == (5, 1, 16)


# --------------------------------------------------------------------------- engine and patterns

def test_pattern_constants_compare_by_bits():
    f = lambda v, dt="f32": b.const(v, dt, ())  # noqa: E731
    assert Pat(const=-0.0).match(f(-0.0)) is not None
    assert Pat(const=-0.0).match(f(0.0)) is None
    assert Pat(const=0.0).match(f(-0.0)) is None
    assert Pat(const=float("nan")).match(f(float("nan"))) is not None
    assert Pat(const=float("nan")).match(f(float("inf"))) is None
    assert Pat(const=1.0).match(f(1.0 + 2.0 ** -40)) is not None  # rounds to 1.0 in f32
    assert Pat(const=1.0).match(f(1.0 + 2.0 ** -40, "f64")) is None
    assert Pat(const=0.1).match(f(0.1)) is None  # 0.1 is not an f32: never matches
    assert Pat(const=-0.0).match(f(0, "i32")) is not None  # integer zero
    assert Pat(const=0.5).match(f(0, "i32")) is None
    x, y = b.ldg(0, "f32", S), b.ldg(1, "f32", S)
    same = Pat(ops={Op.ADD}, srcs=(Pat(name="a"), Pat(name="a")))
    assert same.match(b.make(Op.ADD, (x, x))) == {"a": x}
    assert same.match(b.make(Op.ADD, (x, y))) is None
    comm = Pat(ops={Op.ADD}, commutative=True, srcs=(Pat(ops={Op.NEG}, name="n"), Pat(name="o")))
    nx = b.unary(Op.NEG, x)
    assert comm.match(b.make(Op.ADD, (y, nx))) == {"n": nx, "o": y}
    assert Pat(kind="i").match(x) is None and Pat(kind="f").match(x) == {}


def _swap(_, n):
    return b.make(n.op, (n.srcs[1], n.srcs[0]))


def test_loop_guard_names_the_rules():
    p = b.program(lambda x, y: x + y, [("f32", S)] * 2)
    t0 = time.perf_counter()
    with pytest.raises(RewriteLoopError) as e:
        rewrite(p, [Rule("swap_add", Pat(ops={Op.ADD}), _swap)])
    assert "swap_add" in str(e.value) and e.value.rules == ("swap_add",)
    assert isinstance(e.value, RuntimeError) and isinstance(e.value, HologramError)
    pair = [
        Rule("add_to_sub", Pat(ops={Op.ADD}, srcs=(Pat(name="x"), Pat(name="y"))),
             lambda bd, n: b.make(Op.SUB, (bd["x"], b.unary(Op.NEG, bd["y"])))),
        Rule("sub_to_add", Pat(ops={Op.SUB}, srcs=(Pat(name="x"), Pat(ops={Op.NEG},
                                                                      srcs=(Pat(name="y"),)))),
             lambda bd, n: b.make(Op.ADD, (bd["x"], bd["y"]))),
    ]
    with pytest.raises(RewriteLoopError) as e:
        rewrite(p, pair)
    assert set(e.value.rules) == {"add_to_sub", "sub_to_add"}
    # a rewrite undone one pass later by another rule (the inner node is new, so the
    # per-instruction guard does not see it): caught at the pass level
    wrap = Rule("wrap", Pat(ops={Op.ADD}, srcs=(Pat(name="x", where=lambda v: v.op is not Op.NEG),
                                                Pat(name="y"))),
                lambda bd, n: b.make(Op.ADD, (b.unary(Op.NEG, b.unary(Op.NEG, bd["x"])),
                                              bd["y"])))
    neg_neg = next(r for r in CANONICAL_RULES if r.name == "neg_neg")
    with pytest.raises(RewriteLoopError) as e:
        rewrite(p, [wrap, neg_neg])
    assert set(e.value.rules) <= {"wrap", "neg_neg"} and "neg_neg" in e.value.rules
    grow = Rule("grow", Pat(ops={Op.NEG}), lambda bd, n: b.unary(Op.NEG, b.unary(Op.NEG, n)))
    with pytest.raises(RewriteLoopError, match="grow"):
        rewrite(b.program(lambda x: -x, [("f32", S)]), [grow], max_rewrites=50)
    assert time.perf_counter() - t0 < 2.0


def test_rule_must_keep_dtype_and_shape():
    p = b.program(lambda x: -x, [("f32", S)])
    bad = Rule("bad", Pat(ops={Op.NEG}), lambda bd, n: b.const(0.0, "f64", S))
    with pytest.raises(ValueError, match="bad"):
        rewrite(p, [bad])


# --------------------------------------------------------------------------- property test

CONSTS = [0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 3.0, float("nan"), float("inf"), float("-inf"), 4.0]
UNARY = [Op.NEG, Op.ABS, Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.RECIP, Op.TANH, Op.SIGMOID,
         Op.ERF, Op.SIN, Op.COS]
BINARY = [Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MIN, Op.MAX, Op.POW]
PS = (3, 4)


@st.composite
def expressions(draw):
    n_in = draw(st.integers(2, 3))
    steps = draw(st.lists(st.tuples(
        st.sampled_from(["u", "b", "b", "b", "bc", "cb", "sel", "mad", "move", "eq", "cvt",
                         "muladd"]),
        st.integers(0, 99), st.integers(0, 99), st.integers(0, 99)), min_size=1, max_size=10))
    n_out = draw(st.integers(1, 2))

    def fn(*xs):
        d = xs[0].dtype
        pool = [x.v for x in xs] + [b.const(2.0, d, PS), b.const(-0.0, d, PS)]
        for kind, i, j, k in steps:
            x, y, z = (pool[q % len(pool)] for q in (i, j, k))
            c = b.const(CONSTS[k % len(CONSTS)], d, PS)
            if kind == "u":
                v = b.unary(UNARY[j % len(UNARY)], x)
            elif kind == "b":
                v = b.make(BINARY[k % len(BINARY)], (x, y))
            elif kind == "bc":
                v = b.make(BINARY[j % len(BINARY)], (x, c))
            elif kind == "cb":
                v = b.make(BINARY[j % len(BINARY)], (c, x))
            elif kind == "sel":
                v = b.make(Op.SEL, (b.make(Op.CMPLT, (x, y)), y if k % 2 else z, z))
            elif kind == "mad":
                v = b.make(Op.MAD if k % 2 else Op.FMA, (x, y, z))
            elif kind == "muladd":
                m = b.make(Op.MUL, (x, y))
                v = b.make(Op.ADD, (m, z) if k % 2 else (z, m))
            elif kind == "cvt":
                v = b.cast(b.cast(x if j % 2 else c, "f32" if d.name == "f64" else "f64"), d)
            elif kind == "eq":
                v = b.make(Op.SEL, (b.make(Op.CMPEQ, (c, x)), x, y))
            else:
                t = b.permute(b.reshape(x, (2, 6)) if j % 2 else x, (1, 0))
                v = b.reshape(b.permute(t, (1, 0)), PS)
            pool.append(v)
        fresh = pool[n_in + 2:] or pool[:1]
        return tuple(Var(v) for v in fresh[-n_out:])

    return fn, n_in


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions(), st.sampled_from(DTYPES), st.integers(0, 2 ** 16))
def test_canonical_programs_evaluate_identically(case, dtype, seed):
    fn, n_in = case
    p = b.program(fn, [(dtype, PS)] * n_in)
    q, st_ = canonicalize(p)
    q.verify()
    # bit-exact against the reference only without the pow rules: NumPy's AVX-512 power
    # is not correctly rounded (x**2 != x*x in the last bit for some x; POW_RULES' own
    # test checks them against exact rationals)
    exact, _ = canonicalize(p, rules=EXACT_RULES)
    assert_equivalent(p, exact, seeds=(seed, seed + 1))
    again, st2 = canonicalize(q, rules=CANONICAL_RULES)  # not the cache: a real second run
    assert again.hash == q.hash and st2.fired == 0


def test_integer_programs():
    """Identities that hold for integers apply (x + 0, x * -1 with wrap-around);
    MAD, which is float-only, is not formed."""
    big = b.const(2 ** 31 - 1, "i32", (4,))
    p = b.program(lambda x, y: (((x * 1 + 0) * -1 - 0) + (Var(big) + 1), x * y + x,
                                x.maximum(x)), [("i32", (4,))] * 2)
    q, st_ = canonicalize(p)
    assert st_.rules["mul_one"] == 1 and st_.rules["mul_neg_one"] == 1
    assert st_.rules["add_neg_zero"] == 1 and st_.rules["fold_elementwise"] == 1
    assert not any(v.op is Op.MAD for v in q.instructions)
    ins = [np.array([-2 ** 31, 0, 5, 2 ** 31 - 1], np.int32), np.array([1, -1, -2 ** 31, 7],
                                                                        np.int32)]
    for g, w in zip(evaluate(q, ins)[0], evaluate(p, ins)[0], strict=True):
        assert np.array_equal(g, w)


def test_batched_gemm_keeps_its_operands_views_and_sheds_result_reshapes():
    """No rule rewrites a GEMM itself; the movement rules around it still apply: a
    permute undone on an operand folds away, and a result flattened to [B, m, n] and
    split back (what torch's bmm lowering leaves) is the GEMM's own value."""
    def fn(x, y):
        g = x.permute(0, 1, 3, 2).permute(0, 1, 3, 2) @ y.permute(0, 1, 3, 2)
        return g.reshape(6, 4, 5).reshape(2, 3, 4, 5) * 1.0

    p = b.program(fn, [("f64", (2, 3, 4, 6)), ("f64", (2, 3, 5, 6))])
    q, _ = canonicalize(p)
    q.verify()
    assert [v.op for v in q.instructions] == [Op.LDG, Op.LDG, Op.PERMUTE, Op.GEMM, Op.STG]
    (g,) = [v for v in q.instructions if v.op is Op.GEMM]
    assert g.shape == (2, 3, 4, 5) and g.srcs[0].op is Op.LDG
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal((2, 3, 4, 6)), rng.standard_normal((2, 3, 5, 6))]
    np.testing.assert_array_equal(evaluate(q, ins)[0][0], evaluate(p, ins)[0][0])
