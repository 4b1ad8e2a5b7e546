"""Session.module under DistributedDataParallel: two processes (gloo, on this machine) train like the eager module
under DDP.

The session is built here first, so that each process's own build of the same module comes from the build cache
(the backward of BatchNorm in training mode too, now that a reduction's backward is named alike in every process:
test_fixes.py; the two processes built nothing on 2026-11-30, 9 s against the build's 19 s here).
Each process then trains the small ConvNet of the zoo (BatchNorm in training mode) for a few SGD steps on its half
of the batch, once through its session's module and once eagerly, both wrapped in DDP.
"""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from tests.zoo import SmallNet

import dcnb
from dcnb._src import cache

pytestmark = pytest.mark.compile

WORLD = 2
BATCH = 8  # per process: the shapes the session compiles
STEPS = 4
RECIPE = [{"name": "auto_optimize"}]


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch; process r trains on rows r * BATCH to (r + 1) * BATCH."""
    generator = torch.Generator().manual_seed(1)
    return torch.randn(WORLD * BATCH, 1, 8, 8, generator=generator), torch.randint(
        0, 3, (WORLD * BATCH,), generator=generator
    )


def _train(net: torch.nn.Module, x: torch.Tensor, target: torch.Tensor) -> list[float]:
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = F.cross_entropy(net(x), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _worker(rank: int, folder: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=WORLD)
    try:
        x, target = (t[rank * BATCH : (rank + 1) * BATCH] for t in _data())
        torch.manual_seed(rank)  # different initial weights: DDP starts every process from rank 0's
        ours, reference = SmallNet(), SmallNet()
        session = dcnb.replay(ours, x, recipe=RECIPE, training=True, baselines=(), time_budget=0.01)
        reference.load_state_dict(ours.state_dict())
        results = {}
        for name, net in (("dcnb", session.module), ("torch", reference)):
            net.train()
            results[name] = _train(DDP(net), x, target)
        # parameters and buffers (BatchNorm's statistics, which DDP broadcasts from rank 0 before each forward)
        results["state"] = {k: v.detach().clone() for k, v in ours.state_dict().items()}
        results["reference"] = {k: v.detach().clone() for k, v in reference.state_dict().items()}
        results["params"] = [name for name, _ in ours.named_parameters()]
        torch.save(results, f"{folder}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(900)
def test_the_session_module_trains_under_ddp_like_the_eager_module(tmp_path, monkeypatch):
    # one thread per process, as torchrun sets it: two processes share this machine's cores (the build is for the
    # threads it will run on, so this comes first)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    x, _ = _data()
    built = dcnb.replay(SmallNet(), x[:BATCH], recipe=RECIPE, training=True, baselines=(), time_budget=0.01)
    assert all(s.ok for s in built.history)
    builds = cache.root() / "builds"
    before = set(builds.iterdir())
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=WORLD, join=True)
    assert set(builds.iterdir()) == before, "the processes built again what the session had built"
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for rank, result in enumerate(ranks):
        assert result["dcnb"] == pytest.approx(result["torch"], rel=1e-4), rank
        assert result["dcnb"][-1] < result["dcnb"][0]
        for name, want in result["reference"].items():
            torch.testing.assert_close(result["state"][name], want, rtol=1e-4, atol=1e-5, msg=f"rank {rank}: {name}")
    # the processes trained on different halves of the batch, so their losses differ; the gradients were averaged
    # across them, so the parameters did not (DDP's hooks saw dcnb's gradients land)
    assert ranks[0]["dcnb"][0] != ranks[1]["dcnb"][0]
    for name in ranks[0]["params"]:
        torch.testing.assert_close(ranks[1]["state"][name], ranks[0]["state"][name], rtol=0, atol=0, msg=name)
