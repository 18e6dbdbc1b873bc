"""Runtime libraries compiled ahead of need, in background threads.

A torch.compile'd model's first call spends seconds in PyTorch's tracing (dynamo, then
AOT autograd) before hologram sees the graph; on a cold kernel cache the libraries
every program shares (the GEMM driver, MKL's shim, the attention driver, the thread
team) were another second of compiler time after that. ``import hologram_torch``
starts them one after another on one thread (:func:`start_in_order`), so they build on
the core dynamo's tracing leaves idle; the backend's first call starts any that thread
has not reached yet (:func:`start`), each on its own thread, beside AOT autograd.

A prewarm only compiles and loads (``CCompiler.compile``, whose kernel cache and
loaded-library table are locked per key): the runtime modules' own once-per-process
set-up (binding the BLAS, ``functools.cache``) stays on the thread that needs it,
which finds the library built, or waits on the key's lock while it is being built.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from .. import threads

_lock = threading.Lock()
_started: set[str] = set()  # the libraries a prewarm was started for


def _jobs(cc: Any) -> dict[str, Callable[[], Any]]:
    """Each prewarm by name: compiling a runtime library through ``cc``, or linking
    MKL's shim (``blas.mkl_shim_prewarm``: not a source of hologram's)."""
    from . import attention, bf16_gemm, blas, team

    return {"gemm": lambda: cc.compile(blas.runtime_source(), blas.RUNTIME_KEY),
            "mkl-shim": blas.mkl_shim_prewarm,
            "team": lambda: cc.compile(team.library_source(), team.RUNTIME_KEY),
            "attention": lambda: cc.compile(attention.runtime_source(("f32",)),
                                            attention.RUNTIME_KEY),
            "bf16-gemm": lambda: cc.compile(bf16_gemm.BF16_GEMM_C, bf16_gemm.KERNEL_KEY,
                                            team=False)}


def start(cc: Any, attention: bool = False, bf16: bool = False) -> list[threading.Thread]:
    """Compile, one daemon thread each, the runtime libraries ``cc``'s programs will
    load: the GEMM driver and MKL's shim (``blas.mkl_shim_prewarm``), the thread team
    when it runs the loops, the (f32) attention driver when ``attention``, and the bf16
    GEMM kernel (``bf16_gemm``: 1.3 s of gcc) when ``bf16``. Each is started once per
    process; returns the threads started now (tests join them)."""
    want = (["gemm", "mkl-shim", "team"] + (["attention"] if attention else [])
            + (["bf16-gemm"] if bf16 else []))
    todo = [w for w in want if _applies(w) and _claim(w)]
    if not todo:
        return []
    jobs = _jobs(cc)
    out = []
    for name in todo:
        t = threading.Thread(target=_quietly, args=(jobs[name],), daemon=True,
                             name=f"hologram-prewarm-{name}")
        t.start()
        out.append(t)
    return out


#: What ``import hologram_torch`` prewarms, in this order: what every program with a
#: GEMM needs first, the attention driver (only transformers' programs load it) last.
IMPORT_ORDER = ("gemm", "mkl-shim", "team", "attention")


def start_in_order(find_cc: Callable[[], Any], names: Sequence[str] = IMPORT_ORDER
                   ) -> threading.Thread:
    """One daemon thread that finds the C compiler (``find_cc()``; nothing happens when it
    returns None) and runs the prewarms ``names`` one after another, skipping those
    :func:`start` began first. One thread, not one each: it should take the core that
    the caller's own single-threaded work (dynamo tracing a model) leaves idle, not
    compete with that work for the other. The team's library is skipped unless the
    team runs the loops. Returns the thread (tests join it)."""
    def run() -> None:
        try:
            cc = find_cc()
        except Exception:  # noqa: BLE001 - the first executor finds it again and says why
            return
        if cc is None:
            return
        jobs = _jobs(cc)
        for name in names:
            if _applies(name) and _claim(name):
                _quietly(jobs[name])

    t = threading.Thread(target=run, daemon=True, name="hologram-prewarm-in-order")
    t.start()
    return t


def _applies(name: str) -> bool:
    """Whether prewarm ``name`` builds something this process will load: the team's
    library only when the team runs the loops (``threads.threading``)."""
    return name != "team" or threads.threading()[0] == "team"


def _claim(name: str) -> bool:
    """Whether the caller is the first to start prewarm ``name`` in this process."""
    with _lock:
        if name in _started:
            return False
        _started.add(name)
        return True


def _quietly(job: Callable[[], Any]) -> None:
    try:
        job()
    except Exception:  # noqa: BLE001 - the real use builds it again and raises
        pass
