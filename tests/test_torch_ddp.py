"""A hologram-compiled model trains under DistributedDataParallel (gloo, 2 processes).

DDP averages gradients across ranks with hooks outside the compiled graphs, so
the backend must produce ordinary gradients at the right time. The check: both
ranks end with identical weights, and the mean of the ranks' losses equals the
loss of single-process eager training on the whole global batch, step by step
(each rank holds an equal half, and the loss is a mean, so the averaged gradient
is the full-batch gradient).
"""

from __future__ import annotations

import os
import socket
import time
import warnings

import pytest

torch = pytest.importorskip("torch")
dist = torch.distributed

STEPS, WORLD, LR = 4, 2, 0.1


def _gloo_reason() -> str | None:
    if not dist.is_available():
        return "torch.distributed is not available in this build"
    if not dist.is_gloo_available():
        return "the gloo backend is not available in this build"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.GELU(), torch.nn.Linear(32, 32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 10, generator=g), torch.randint(0, 4, (16,), generator=g)


def _worker(rank: int, port: int, out_dir: str) -> None:
    """One rank: DDP over a hologram-compiled model; saves its weights and losses."""
    warnings.simplefilter("ignore")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP

        from hologram_torch.compile_backend import collect_graphs

        # DDP around the compiled module: DDP's gradient hooks sit on the parameters,
        # outside the graphs. (With torch 2.13 on CPU, torch.compile(DDP(m)) graph-breaks
        # at DDP's forward, which dynamo skips, and compiled no graph when we tried.)
        model = _model()
        compiled = DDP(torch.compile(model, backend="hologram"))
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        x, y = _data()
        shard = slice(rank * len(x) // WORLD, (rank + 1) * len(x) // WORLD)
        losses = []
        with collect_graphs() as graphs:
            for _ in range(STEPS):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(compiled(x[shard]), y[shard])
                loss.backward()
                opt.step()
                losses.append(loss.item())
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        programs = {g.kind: len(g.regions) for g in graphs}
        torch.save({"state": state, "losses": losses, "programs": programs},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(_gloo_reason() is not None, reason=str(_gloo_reason()))
def test_ddp_gloo_two_ranks_match_single_process(tmp_path):
    import torch.multiprocessing as mp

    ctx = mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=False)
    deadline = time.monotonic() + 150
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail("DDP workers did not finish in time")

    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]

    # Reference: one process, eager PyTorch, the whole global batch.
    ref = _model()
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    x, y = _data()
    ref_losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ref(x), y)
        loss.backward()
        opt.step()
        ref_losses.append(loss.item())

    for r in results:  # the model really ran as hologram programs, forward and backward
        assert r["programs"].get("forward", 0) >= 1 and r["programs"].get("backward", 0) >= 1
    a, b = results[0]["state"], results[1]["state"]
    for name, want in ref.state_dict().items():
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0, msg=f"ranks differ: {name}")
        torch.testing.assert_close(a[name], want, atol=2e-5, rtol=1e-4, msg=name)
    mean_losses = [(la + lb) / 2 for la, lb in zip(results[0]["losses"], results[1]["losses"],
                                                   strict=True)]
    assert mean_losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert ref_losses[-1] < ref_losses[0]  # it actually trained
