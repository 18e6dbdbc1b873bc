"""Runtime libraries compiled ahead of need, in background threads.

A torch.compile'd model's first call spends seconds in PyTorch's tracing (dynamo, then
AOT autograd) before hologram sees the graph; on a cold kernel cache the libraries
every program shares (the GEMM driver, MKL's shim, the attention driver, the thread
team) were another second of compiler time after that. Started when the backend is
first called, their compiles run on other cores while AOT autograd traces.

A prewarm only compiles and loads (``CCompiler.compile``, whose kernel cache and
loaded-library table are locked per key): the runtime modules' own once-per-process
set-up (binding the BLAS, ``functools.cache``) stays on the thread that needs it,
which finds the library built, or waits on the key's lock while it is being built.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .. import threads

_lock = threading.Lock()
_started: set[str] = set()  # the libraries a prewarm was started for


def _jobs(cc: Any) -> dict[str, Callable[[], Any]]:
    """Each prewarm by name: compiling a runtime library through ``cc``, or linking
    MKL's shim (``blas.mkl_shim_prewarm``: not a source of hologram's)."""
    from . import attention, blas, team

    return {"gemm": lambda: cc.compile(blas.runtime_source(), blas.RUNTIME_KEY),
            "mkl-shim": blas.mkl_shim_prewarm,
            "team": lambda: cc.compile(team.library_source(), team.RUNTIME_KEY),
            "attention": lambda: cc.compile(attention.runtime_source(("f32",)),
                                            attention.RUNTIME_KEY)}


def start(cc: Any, attention: bool = False) -> list[threading.Thread]:
    """Compile, one daemon thread each, the runtime libraries ``cc``'s programs will
    load: the GEMM driver and MKL's shim (``blas.mkl_shim_prewarm``), the thread team
    when it runs the loops, and the (f32) attention driver when ``attention``. Each is
    started once per process; returns the threads started now (tests join them)."""
    want = ["gemm", "mkl-shim"] + (["team"] if threads.threading()[0] == "team" else []) \
        + (["attention"] if attention else [])
    with _lock:
        todo = [w for w in want if w not in _started]
        _started.update(todo)
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


def _quietly(job: Callable[[], Any]) -> None:
    try:
        job()
    except Exception:  # noqa: BLE001 - the real use builds it again and raises
        pass
