"""A search's compiles on a local Dask cluster of 2 workers: code generated here, compiled on a worker, the
libraries brought back into this machine's cache, every candidate checked and timed here, the workers on this
machine paused meanwhile; from Session.search, %%dcoptimize --cluster and the view's Search."""

import os
import pathlib
import re
import time

import pytest
import torch
from dask.distributed import Client, LocalCluster, get_task_stream
from IPython.core.error import UsageError

import dcnb
from dcnb._src import alone, cluster
from dcnb._src.views.widget import SessionWidget
from tests.models import Mish

pytestmark = pytest.mark.compile

#: a shape no other test builds Mish for: each test's builds are its own
SHAPE = (2, 7, 5, 16)
#: objective memory with a beam of 1: which candidates are tried does not depend on timings
SEARCH = dict(objective="memory", actions=["map_fusion", "tasklet_fusion", "vectorization"], beam=1, depth=2)
TITLES = ["start", "map_fusion", "tasklet_fusion", "vectorization", "tasklet_fusion, vectorization"]


def _session() -> dcnb.Session:
    torch.manual_seed(0)
    return dcnb.optimize(Mish(), torch.rand(*SHAPE), baselines=("torch",), time_budget=0.05)


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("DCNB_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def local_cluster():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as running:
        with Client(running) as client:
            yield running, client


def _state(pid: int) -> str:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _states(pids: list[int], wanted: str) -> set[str]:
    """The processes' states once each is ``wanted`` or a second has passed (a signal takes effect as the process
    is next scheduled)."""
    deadline = time.monotonic() + 1
    while {_state(p) for p in pids} != {wanted} and time.monotonic() < deadline:
        time.sleep(0.01)
    return {_state(p) for p in pids}


def test_a_search_compiles_every_candidate_on_the_workers_of_a_cluster(fresh, local_cluster):
    running, client = local_cluster
    session = _session()
    with get_task_stream(client) as stream:
        result = session.search(300, cluster=running.scheduler_address, **SEARCH)  # reached by its address
    on_workers = [t for t in stream.data if str(t["key"]).startswith("dcnb-compile-")]
    assert result.builds == len(on_workers) > 0, "each build compiled on a worker, none here"
    assert "a Dask cluster of 2 worker threads" in result.headline
    assert [c.title for c in result.candidates] == TITLES
    # the workers' libraries load here: each candidate was checked against PyTorch and timed
    assert all(c.ok for c in result.candidates), [c.error for c in result.candidates]
    assert all(c.dcnb_ms for c in result.candidates if c.same_as is None)
    assert result.replay_error is None and session.current.ok and session.recipe == result.recipe
    # a search here after it finds every binary in the cache
    assert _session().search(300, **SEARCH).builds == 0


def test_workers_on_this_machine_pause_while_a_candidate_is_timed(local_cluster):
    _, client = local_cluster
    pids = list(client.run(os.getpid).values())
    with cluster.DaskCompiles(client, 60):
        with alone.timing():
            assert _states(pids, "T") == {"T"}
        assert "T" not in _states(pids, "S")


def test_a_worker_compiles_for_this_machines_cpu():
    flags = cluster.native_flags()
    assert re.search(r"-march=(?!native)\S+", flags), flags  # the CPU GCC finds here, by its name


@pytest.mark.parametrize(
    "given,cause",
    [
        (42, "search's cluster must be a dask.distributed Client or a scheduler's address, not 42"),
        (["tcp://127.0.0.1:9"], "search's cluster must be a dask.distributed Client or a scheduler's address"),
    ],
)
def test_a_cluster_that_is_not_one_names_its_cause(given, cause):
    session = _session()
    before = session.history
    with pytest.raises(dcnb.DcnbError) as raised:
        session.search(60, cluster=given, **SEARCH)
    assert cause in str(raised.value) and session.history == before


@pytest.mark.deep
def test_the_magic_and_its_view_search_on_the_cluster_named(fresh, local_cluster, ip):
    running, _ = local_cluster
    cell = "class Mish(nn.Module):\n    def forward(self, x):\n        return x * torch.tanh(nn.functional.softplus(x))"
    timed = "--inputs torch.rand(2,3,9,8) --baselines torch --time-budget 0.05"
    ip.run_cell_magic("dcoptimize", f"{timed} --search 8 --cluster {running.scheduler_address} --as clustered", cell)
    session = ip.user_ns["clustered"]
    assert session.current.ok and len(session.history) >= 1
    # the view's Search compiles there too
    view = SessionWidget(session, variable="clustered", cluster=running.scheduler_address)
    asked = {"method": "custom", "content": {"event": "search", "budget": 3}}
    view._handle_msg({"content": {"data": asked}, "buffers": []})
    assert "on a Dask cluster of 2 worker threads" in view.message, view.message
    # a scheduler that does not answer: said, and the session built before it stands
    with pytest.raises(UsageError, match=r"no Dask scheduler answers at 'tcp://127.0.0.1:9'.*holds the steps before"):
        ip.run_cell_magic("dcoptimize", f"{timed} --search 8 --cluster tcp://127.0.0.1:9 --as unreached", cell)
    assert ip.user_ns["unreached"].current.ok
