"""What makes a cold first call short: repeated layers compile one shared body, a big
library compiles in parts at once, the scheduler names every value it must store in
one pass, and the runtime libraries compile in the background (``prewarm``).

Each is checked for the property it exists for (fewer bodies, several parts, few
passes, a warm cache) and for results against the reference interpreter.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pytest

import hologram as hg
import hologram.compiler.cc as ccmod
from hologram.backends.reference import evaluate
from hologram.compiler import attention, bf16_gemm, blas, lower, prewarm, shared_bodies
from hologram.compiler.cc import C_PRELUDE, PART_MARK, CCompiler, CompileError, split_parts
from hologram.isa import builder as b

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture
def cpu(native_cpu: hg.Executor) -> hg.Executor:
    return native_cpu


@pytest.fixture
def private_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(d))
    return d


def _layers(x, w1, w2, w3):
    h = x
    for w in (w1, w2, w3):  # three layers alike: one GEMM + epilogue, one row kernel
        h = ((h @ w) + 1.0).tanh()
        h = h - h.max(axis=1, keepdims=True)
    return h


def _specs(n: int = 48) -> list[tuple[str, tuple[int, ...]]]:
    return [("f32", (n, n))] * 4


def _inputs(n: int = 48, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((n, n)).astype(np.float32) for _ in range(4)]
    xs[0][0, :3] = [np.nan, np.inf, -np.inf]
    return xs


def _run(ex: hg.Executor, p, ins: list[np.ndarray]) -> None:
    want, _ = evaluate(p, ins)
    got = [np.empty(s, d.np_dtype) for d, s in p.output_specs]
    ex.launch(p, ins, got)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


# --- shared bodies --------------------------------------------------------------------
def test_repeated_layers_compile_one_body(cpu):
    p = b.program(_layers, _specs())
    src = cpu.compile(p).source
    assert "hg_s0_0(L);" in src, src  # later layers call the first layer's body
    bodies = len(re.findall(r"void hg_s\d+_\d+\(void \*\*B\) \{", src))
    wrappers = src.count("void *L[] = {")
    assert wrappers >= 4 and bodies < wrappers, (bodies, wrappers)
    for seed in range(2):
        _run(cpu, p, _inputs(seed=seed))


def test_canonical_form_ignores_slots_and_local_numbers():
    one = shared_bodies.Unit("k3", ("k3",), "void k3(void **B) {\n  float *p7_f32 = "
                             "(float *)B[7];\n  float t12 = p7_f32[0];\n  "
                             "((float *)B[9])[0] = t12;\n}")
    two = shared_bodies.Unit("k8", ("k8",), "void k8(void **B) {\n  float *p20_f32 = "
                             "(float *)B[20];\n  float t40 = p20_f32[0];\n  "
                             "((float *)B[2])[0] = t40;\n}")
    c1, c2 = shared_bodies.canonical(one), shared_bodies.canonical(two)
    assert c1 is not None and c2 is not None
    assert c1[0] == c2[0]
    assert (c1[1], c2[1]) == ([7, 9], [20, 2])
    texts = shared_bodies.share([one, two])
    assert "void *L[] = {B[7], B[9]};" in texts[0] and "void *L[] = {B[20], B[2]};" in texts[1]
    assert texts[1].startswith("void hg_s0_0(void **B);")  # declared, defined once


def test_a_unit_that_indexes_the_table_otherwise_keeps_its_text():
    u = shared_bodies.Unit("k1", ("k1",), "void k1(void **B) { int i = 2; B[i] = 0; }")
    assert shared_bodies.canonical(u) is None
    assert shared_bodies.share([u, u]) == [u.text, u.text]


def test_lone_units_are_unchanged():
    u = shared_bodies.Unit("k1", ("k1",), "void k1(void **B) { ((float *)B[3])[0] = 1; }")
    v = shared_bodies.Unit("k2", ("k2",), "void k2(void **B) { ((float *)B[4])[0] = 2; }")
    assert shared_bodies.share([u, v]) == [u.text, v.text]


# --- split builds ---------------------------------------------------------------------
def test_a_big_library_builds_in_parts(cpu, monkeypatch, private_cache):
    monkeypatch.setattr(ccmod, "PART_CHARS", 300)
    p = b.program(_layers, _specs(40))
    c = cpu.compile(p)
    parts = split_parts(c.source)
    assert parts is not None and len(parts) > 1
    assert all(t.startswith("#define HG_PART 1\n") for t in parts[1:])
    assert not parts[0].startswith("#define HG_PART")
    _run(cpu, p, _inputs(40, seed=3))


def test_split_parts_needs_marks_and_size(monkeypatch):
    assert split_parts("int x;\n") is None
    monkeypatch.setattr(ccmod, "PART_CHARS", 10)
    src = "H\n" + "".join(f"{PART_MARK}\nunit{i} " + "x" * 30 + "\n" for i in range(5))
    parts = split_parts(src)
    assert parts is not None and len(parts) == 5
    assert "".join(p.split("H\n", 1)[1] for p in parts) == src.split("H\n", 1)[1]
    monkeypatch.setattr(ccmod, "MAX_PARTS", 2)
    assert len(split_parts(src) or []) == 2


def test_an_error_in_a_later_part_shows_that_part(monkeypatch, private_cache, tmp_path):
    cc = CCompiler.find()
    if cc is None:
        pytest.skip("no C compiler")
    monkeypatch.setattr(ccmod, "PART_CHARS", 50)
    good = [f"void ok{i}(void **B) {{ ((float *)B[0])[0] = {i}.0f; }}\n" for i in range(3)]
    bad = "void broken(void **B) { this is not C; }\n"
    src = C_PRELUDE + "\n" + "".join(f"{PART_MARK}\n{u}" for u in (*good, bad))
    with pytest.raises(CompileError) as e:
        cc.build(src, tmp_path / "k.so", tmp_path / "k.c")
    assert "this is not C" in e.value.source and "HG_PART" in e.value.source


# --- one scheduling pass names every value to store --------------------------------------
def test_materialized_operands_are_found_in_one_pass(cpu, monkeypatch):
    def many(x, w):
        outs = [(x * float(i + 1)).T @ w for i in range(6)]  # each operand: a computed view
        acc = outs[0]
        for o in outs[1:]:
            acc = acc + o
        return acc

    calls = []
    real = lower.plan

    def counting(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(lower, "plan", counting)
    p = b.program(many, [("f32", (24, 16)), ("f32", (24, 8))])
    rng = np.random.default_rng(5)
    _run(cpu, p, [rng.standard_normal((24, 16)).astype(np.float32),
                  rng.standard_normal((24, 8)).astype(np.float32)])
    assert 1 < len(calls) <= 3, len(calls)  # it did need buffers, found in one pass


# --- runtime libraries in the background -------------------------------------------------
def test_prewarm_fills_the_cache(monkeypatch, private_cache):
    cc = CCompiler.find()
    if cc is None:
        pytest.skip("no C compiler")
    monkeypatch.setattr(prewarm, "_started", set())
    monkeypatch.setattr(ccmod, "_LOADED", {})
    started = prewarm.start(cc, attention=True, bf16=True)
    assert {t.name for t in started} >= {"hologram-prewarm-gemm",
                                         "hologram-prewarm-attention",
                                         "hologram-prewarm-bf16-gemm"}
    for t in started:
        t.join(120)
    for source, key in ((blas.runtime_source(), blas.RUNTIME_KEY),
                        (attention.runtime_source(("f32",)), attention.RUNTIME_KEY),
                        (bf16_gemm.BF16_GEMM_C, bf16_gemm.KERNEL_KEY)):
        assert ccmod.KERNEL_CACHE.lookup(cc.key_parts(key), source) is not None
    assert prewarm.start(cc, attention=True, bf16=True) == []  # once per process


def test_prewarm_links_the_mkl_shim(monkeypatch, private_cache):
    """MKL's shim is linked on a prewarm thread, so the first program's BLAS set-up
    finds it in the cache instead of running the linker on the critical path."""
    cc = CCompiler.find()
    found = blas._mkl_found()
    if cc is None or found is None:
        pytest.skip("no C compiler or no MKL wheel")
    monkeypatch.setattr(prewarm, "_started", set())
    monkeypatch.setattr(blas, "_loaded", lambda pattern: [])  # as in a fresh process
    linked = []
    monkeypatch.setattr(blas, "_mkl_shim", lambda d, n: linked.append((d, n)))
    threads = prewarm.start(cc)
    assert "hologram-prewarm-mkl-shim" in {t.name for t in threads}
    for t in threads:
        t.join(120)
    assert linked == [found]


def test_prewarm_in_order_runs_one_job_at_a_time_and_skips_started_ones(monkeypatch):
    """The import's prewarm thread runs its jobs one after another on one thread, and
    leaves a job that :func:`prewarm.start` began first to that thread."""
    ran: list[tuple[str, str]] = []

    def jobs(cc):
        return {n: (lambda n=n: ran.append((n, threading.current_thread().name)))
                for n in prewarm.IMPORT_ORDER}

    monkeypatch.setattr(prewarm, "_jobs", jobs)
    monkeypatch.setattr(prewarm, "_started", {"mkl-shim"})  # as if start() took it
    monkeypatch.setattr(prewarm.threads, "threading", lambda: ("team", "test"))
    prewarm.start_in_order(lambda: object()).join(30)
    assert ran == [(n, "hologram-prewarm-in-order") for n in ("gemm", "team", "attention")]
    assert prewarm.start(object(), attention=True) == []  # all claimed now
    ran.clear()
    monkeypatch.setattr(prewarm, "_started", set())
    prewarm.start_in_order(lambda: None).join(30)  # no compiler: nothing runs
    assert ran == [] and prewarm._started == set()


def test_importing_hologram_torch_prewarms_the_runtime(tmp_path):
    """``import hologram_torch`` builds the GEMM driver on a background thread, into an
    empty kernel cache; ``HOLOGRAM_PREWARM=0`` leaves it to the first program."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    if CCompiler.find() is None:
        pytest.skip("no C compiler")
    child = (
        "import json, threading\n"
        "import hologram_torch\n"
        "from hologram.compiler import blas, cc\n"
        "th = [t for t in threading.enumerate() if t.name == 'hologram-prewarm-in-order']\n"
        "[t.join(600) for t in th]\n"
        "c = cc.CCompiler.find()\n"
        "hit = cc.KERNEL_CACHE.lookup(c.key_parts(blas.RUNTIME_KEY), blas.runtime_source())\n"
        "print(json.dumps({'threads': len(th), 'built': hit is not None}))\n")
    for setting, want in (("1", {"threads": 1, "built": True}),
                          ("0", {"threads": 0, "built": False})):
        env = {**os.environ, "HOLOGRAM_CACHE_DIR": str(tmp_path / setting),
               "HOLOGRAM_PREWARM": setting}
        r = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True,
                           text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-2000:]
        assert json.loads(r.stdout.strip().splitlines()[-1]) == want, setting


def test_the_compiler_probe_does_not_build_the_thread_team(monkeypatch, private_cache):
    """The probe library opens no parallel region, so it is not pointed at the team: the
    team's library then builds on a prewarm thread, not before the graph is traced."""
    cc = CCompiler.find()
    if cc is None:
        pytest.skip("no C compiler")
    bound = []
    monkeypatch.setattr(ccmod, "_bind_team", lambda c, lib: bound.append(lib))
    monkeypatch.setattr(ccmod, "_LOADED", {})
    fresh = CCompiler(cc.command, cc._version_text)
    assert fresh.flags  # probed now, in the empty cache
    assert bound == []
    fresh.compile(C_PRELUDE + "void hg_f(void **B) { (void)B; }\n", {"program": "t"})
    assert len(bound) == 1  # a program's library is bound as before


def test_attention_runtime_per_dtype():
    cc = CCompiler.find()
    if cc is None:
        pytest.skip("no C compiler")
    assert "hg_attn_f64" not in attention.runtime_source(("f32",))
    assert "if (d->f64)" in attention.runtime_source(("f32", "f64"))
    with pytest.raises(ValueError, match="dtypes"):
        attention.runtime(cc, ("f16",))


def _child_takes(cache, q) -> None:
    q.put(cache._key_lock("k").acquire(timeout=5))


def _child_finds(q) -> None:
    q.put(ccmod._FIND_LOCK.acquire(timeout=5))


def _child_got_the_lock(held, child_target, *args) -> bool:
    """Hold ``held`` (as a thread building or probing does), fork, and return what the
    child reported: whether it could take the lock itself (the at-fork reset)."""
    import multiprocessing as mp
    import sys

    if sys.platform == "win32" or "fork" not in mp.get_all_start_methods():
        pytest.skip("no fork here")
    held.acquire()
    try:
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        child = ctx.Process(target=child_target, args=(*args, q))
        child.start()
        got = q.get(timeout=30)
        child.join(30)
        return got
    finally:
        held.release()


def test_a_fork_during_a_build_leaves_the_child_unlocked(tmp_path):
    from hologram.cache import KernelCache

    cache = KernelCache(tmp_path)
    # as a prewarm thread building key "k" holds it
    assert _child_got_the_lock(cache._key_lock("k"), _child_takes, cache) is True


def test_a_fork_during_the_compiler_probe_leaves_the_child_unlocked():
    """``import hologram_torch``'s prewarm thread probes the compiler under a lock; a fork
    meanwhile must not leave the child a lock no thread of its own will release."""
    assert _child_got_the_lock(ccmod._FIND_LOCK, _child_finds) is True


def _blocked_finish(monkeypatch: pytest.MonkeyPatch, cpu: hg.Executor):
    """Hold every native build of ``cpu``'s backend until the returned event is set."""

    gate = threading.Event()
    started = threading.Event()
    finish = type(cpu.backend)._finish

    def held(self, *a, **k):
        started.set()
        assert gate.wait(60), "the test never released the build"
        return finish(self, *a, **k)

    monkeypatch.setattr(type(cpu.backend), "_finish", held)
    return gate, started


def test_compile_in_background_returns_before_the_native_build(cpu, monkeypatch):
    p = b.program(lambda x: ((x.exp() * 2.0) + 0.375).tanh(), [("f32", (32, 32))])
    gate, started = _blocked_finish(monkeypatch, cpu)
    fut = cpu.compile_in_background(p)
    assert started.wait(30) and not fut.done()  # scheduled; its build is held
    gate.set()
    compiled = fut.result(60)
    assert cpu.compile(p) is compiled  # kept by the executor
    _run(cpu, p, _inputs(32)[:1])


def test_one_build_serves_the_same_program_twice(cpu, monkeypatch):
    """A program whose content is already building is not prepared again: the second
    request gets the first's future, and a synchronous compile waits for it (a model's
    repeated weight shapes give the same derived program several times)."""
    p = b.program(lambda x: (x * 1.75 - 0.5).sin(), [("f32", (16, 8))])
    gate, started = _blocked_finish(monkeypatch, cpu)
    prepared = []
    prepare = type(cpu.backend).prepare

    def counted(self, program):
        prepared.append(program.hash)
        return prepare(self, program)

    monkeypatch.setattr(type(cpu.backend), "prepare", counted)
    first = cpu.compile_in_background(p)
    again = cpu.compile_in_background(b.program(lambda x: (x * 1.75 - 0.5).sin(),
                                                [("f32", (16, 8))]))
    assert again is first and len(prepared) == 1
    assert started.wait(30)
    waiting = threading.Thread(target=lambda: cpu.compile(p))
    waiting.start()
    gate.set()
    waiting.join(60)
    assert first.result(60) is cpu.compile(p) and len(prepared) == 1


def test_compile_in_background_carries_the_error(cpu, monkeypatch):
    p = b.program(lambda x: (x + 3.25).sqrt(), [("f32", (8,))])

    def broken(self, *a, **k):
        raise CompileError("the C compiler failed", log="kernel.c:1: error")

    monkeypatch.setattr(type(cpu.backend), "_finish", broken)
    with pytest.raises(CompileError):
        cpu.compile_in_background(p).result(60)


def test_torch_plan_is_ready_before_its_programs_build(cpu, monkeypatch):
    """torch.compile's graph compiler returns while the C compiler runs; the first
    call waits for it (and the result is right)."""
    torch = pytest.importorskip("torch")
    gate, started = _blocked_finish(monkeypatch, cpu)
    fn = torch.compile(lambda a: torch.tanh(a * 3.0 - 0.25).sum(1), backend="hologram",
                       options={"executor": cpu})
    a = torch.randn(5, 7)

    out: list = []
    t = threading.Thread(target=lambda: out.append(fn(a)))
    t.start()
    assert started.wait(60)  # the plan exists; its native build is held
    t.join(0.5)
    assert t.is_alive() and not out  # the first call waits for the build
    gate.set()
    t.join(120)
    torch.testing.assert_close(out[0], torch.tanh(a * 3.0 - 0.25).sum(1))


def test_a_failed_background_build_raises_at_the_first_call(cpu, monkeypatch):
    torch = pytest.importorskip("torch")

    def broken(self, *a, **k):
        raise CompileError("the C compiler failed", log="kernel.c:1: error")

    monkeypatch.setattr(type(cpu.backend), "_finish", broken)
    fn = torch.compile(lambda a: torch.sinh(a * 1.5 + 0.125), backend="hologram",
                       options={"executor": cpu})
    with pytest.raises(CompileError, match="C compiler failed"):
        fn(torch.randn(6))


def test_repeated_layers_order_operands_alike():
    """Commutative operands sort by the computation's form before the inputs it reads,
    so a layer over other buffers renders to the same C (and shares one body)."""
    from hologram.compiler.rewrite import form_key, order_key, structural_key

    def layer(x):
        lo, hi = x.slice((0,), (64,)), x.slice((64,), (64,))
        return (hi.exp() * 0.5) + (lo * 2.0)

    p = b.program(lambda *xs: tuple(layer(x) for x in xs), [("f32", (128,))] * 8)
    sums = [s.srcs[0] for s in p.outputs]
    assert len({form_key(v) for v in sums}) == 1
    assert len({structural_key(v) for v in sums}) == 8
    # the same swap decision in every layer (with the inputs' digests first, each
    # layer's order was a coin flip: 1 in 128 to agree across eight)
    assert len({order_key(v.srcs[1]) < order_key(v.srcs[0]) for v in sums}) == 1


def test_layers_with_different_histories_order_operands_alike():
    """The near form decides before the whole one: a layer's product of its input and a
    coefficient is ordered the same whatever computed that input further up (ResNet-18's
    Winograd transforms read a different history in every stage), so the layers render
    to one body. With the whole form first each layer's order was a coin flip."""
    from hologram.compiler.rewrite import form_key, near_form_key, order_key

    def history(x, depth):  # a different computation before each layer
        for i in range(depth):
            x = (x * float(i + 2)).tanh()
        return x

    def layer(x):
        coef = b.Var(b.iota((64,), 0, "f32")).tanh()  # the same in every layer, not a constant
        return ((x * 3.0).tanh() * 3.0).tanh() * coef

    p = b.program(lambda *xs: tuple(layer(history(x, i + 4)) for i, x in enumerate(xs)),
                  [("f32", (64,))] * 8)
    products = [s.srcs[0] for s in p.outputs]
    inputs = [v.srcs[0] for v in products]
    assert len({form_key(v) for v in inputs}) == 8  # the whole histories differ
    assert len({near_form_key(v) for v in inputs}) == 1  # the last steps do not
    assert len({order_key(v.srcs[1]) < order_key(v.srcs[0]) for v in products}) == 1
