"""The optimization session on real builds: the seed's Mish flow, replay, undo, the module, the build cache."""

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
import torch

import dcnb
from dcnb._src import build, events, forked, memory
from dcnb._src import session as session_module
from dcnb._src.views import sources
from tests.models import Mish, TinyMLP

pytestmark = pytest.mark.compile

SHAPE = (2, 4, 16, 16)
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mish_session():
    torch.manual_seed(0)
    session = dcnb.optimize(Mish(), torch.rand(*SHAPE), baselines=("torch",), time_budget=0.2)
    for name in ("map_fusion", "tasklet_fusion", "vectorization"):
        session.apply(name)
    return session


def test_seed_flow_every_step_ok(mish_session):
    steps = mish_session.history
    assert [s.name for s in steps] == ["naive", "map_fusion", "tasklet_fusion", "vectorization"]
    for s in steps:
        assert s.ok, s.error
        assert s.check.ok and s.max_abs_error < 1e-5
        assert {"output", "grad x"} <= set(s.check.errors)
        assert s.timings["dcnb"].runs >= 5 and s.timings["torch"].median > 0
        assert s.counts["forward"]["maps"] >= 1 and s.counts["backward"]["maps"] >= 1
    naive, fused, tasklets, vectorized = steps
    # the forward stores three full-size intermediates for the backward until the tasklets merge before autodiff
    assert naive.intermediate_bytes == 3 * 4 * 2 * 4 * 16 * 16
    assert fused.intermediate_bytes == naive.intermediate_bytes
    assert tasklets.intermediate_bytes == 0 and vectorized.intermediate_bytes == 0
    assert fused.counts["forward"]["kernels"] < naive.counts["forward"]["kernels"]
    assert tasklets.counts["forward"]["tasklets"] == 1


def test_a_step_before_autodiff_reports_the_later_steps_it_leaves_out(mish_session):
    # tasklet_fusion regenerates the backward and replays map_fusion, which finds nothing left to fuse: the recipe
    # leaves it out (it would replay to nothing) and the step says so
    tasklets = mish_session.history[2]
    assert [n for n in tasklets.notes if n.startswith("map_fusion")], tasklets.notes
    assert "map_fusion" not in [entry["name"] for entry in mish_session.recipe]


def test_recipe_replays_to_the_same_sdfgs_without_rebuilding(mish_session):
    recipe = json.loads(json.dumps(mish_session.recipe))
    assert recipe == [{"name": "tasklet_fusion"}, {"name": "vectorization"}]
    with events.count() as counted:
        again = dcnb.replay(Mish(), torch.rand(*SHAPE), recipe=recipe, baselines=(), time_budget=0.05)
    assert counted["build"] == 0
    assert again.forward_sdfg.hash_sdfg() == mish_session.forward_sdfg.hash_sdfg()
    assert again.backward_sdfg.hash_sdfg() == mish_session.backward_sdfg.hash_sdfg()
    assert all(s.compile_seconds == 0 for s in again.history)


_COUNT_BUILDS = """
import torch, dcnb
from dcnb._src import events
from tests.models import Mish
with events.count() as counted:
    dcnb.optimize(Mish(), torch.rand(3, 5, 7, 9), baselines=(), time_budget=0.05)
print(counted["build"])
"""


def test_builds_are_cached_by_content_in_process_and_on_disk(fresh_cache, monkeypatch):
    shape = (3, 5, 7, 9)  # a content no other test builds
    with events.count() as counted:
        first = dcnb.optimize(Mish(), torch.rand(*shape), baselines=(), time_budget=0.05)
        second = dcnb.optimize(Mish(), torch.rand(*shape), baselines=(), time_budget=0.05)
    assert counted["build"] == 2  # the forward and the backward, each once
    assert first.current.compile_seconds > 0 and second.current.compile_seconds == 0
    assert len(list(fresh_cache.rglob("*.so"))) >= 2  # forward and backward
    other_process = subprocess.run([sys.executable, "-c", _COUNT_BUILDS], capture_output=True, text=True, cwd=ROOT)
    assert other_process.returncode == 0, other_process.stderr[-3000:]  # (what a failing child said)
    assert other_process.stdout.strip().splitlines()[-1] == "0"
    # another cache, in the same process, holds builds of its own: the process took the binary it had loaded from the
    # first, and the code view found no build folder for it in the second ("the build folder is gone")
    monkeypatch.setenv("DCNB_CACHE", str(fresh_cache / "another"))
    with events.count() as counted:
        third = dcnb.optimize(Mish(), torch.rand(*shape), baselines=(), time_budget=0.05)
    assert counted["build"] == 2 and len(list((fresh_cache / "another").rglob("*.so"))) >= 2
    assert sources.generated(third.forward_sdfg)["text"]


def test_actions_are_offered_with_their_phase_and_matches(mish_session):
    fresh = dcnb.optimize(Mish(), torch.rand(*SHAPE), baselines=(), time_budget=0.05)
    offers = {o.name: o for o in fresh.actions()}
    assert {"expand", "map_fusion", "subgraph_fusion", "tasklet_fusion", "vectorization", "auto_optimize"} <= set(offers)
    assert "gpu" not in offers  # no CUDA here
    assert offers["tasklet_fusion"].before_autodiff and not offers["map_fusion"].before_autodiff
    assert offers["expand"].matches == 0  # Mish's ONNX ops were lowered to maps by the naive step
    assert offers["map_fusion"].matches > 0 and offers["tasklet_fusion"].matches > 0
    after = {o.name: o.matches for o in mish_session.actions()}
    assert after["tasklet_fusion"] == 0 and after["map_fusion"] == 0


def test_where_restricts_an_action_to_chosen_nodes():
    session = dcnb.optimize(Mish(), torch.rand(*SHAPE), baselines=(), time_budget=0.05)
    everywhere = session.actions()
    [everywhere] = [o.matches for o in everywhere if o.name == "map_fusion"]
    label = next(n.map.label for n, _ in session.forward_sdfg.all_nodes_recursive() if hasattr(n, "map"))
    [restricted] = [o.matches for o in session.actions(where=[label]) if o.name == "map_fusion"]
    assert 0 < restricted < everywhere
    step = session.apply("map_fusion", where=[label])
    assert step.ok and step.where == (label,) and 0 < step.applied < everywhere
    assert session.recipe == [{"name": "map_fusion", "where": [label]}]


def test_undo_and_reset_return_to_earlier_states():
    session = dcnb.optimize(Mish(), torch.rand(*SHAPE), baselines=(), time_budget=0.05)
    naive_hash = session.backward_sdfg.hash_sdfg()
    session.apply("tasklet_fusion")
    fused_hash = session.backward_sdfg.hash_sdfg()
    session.apply("vectorization")
    assert session.undo().name == "tasklet_fusion"
    assert session.backward_sdfg.hash_sdfg() == fused_hash
    assert [s.name for s in session.history] == ["naive", "tasklet_fusion"]
    assert session.reset().name == "naive"
    assert session.backward_sdfg.hash_sdfg() == naive_hash and session.recipe == []
    with pytest.raises(dcnb.DcnbError, match="nothing to undo"):
        session.undo()


def test_module_trains_like_pytorch():
    torch.manual_seed(0)
    reference = TinyMLP()
    ours = TinyMLP()
    ours.load_state_dict(reference.state_dict())
    x, target = torch.randn(8, 16), torch.randn(8, 4)
    session = dcnb.optimize(ours, x, baselines=(), time_budget=0.05)
    session.apply("tasklet_fusion")
    model = session.module
    assert {id(p) for p in model.parameters()} == {id(p) for p in ours.parameters()}
    losses = {}
    for name, net in (("torch", reference), ("dcnb", model)):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        losses[name] = []
        for _ in range(4):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), target)
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
    assert losses["dcnb"][-1] < losses["dcnb"][0]
    assert losses["dcnb"] == pytest.approx(losses["torch"], rel=1e-4)
    for p, q in zip(reference.parameters(), ours.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_module_backward_follows_autograd_rules_for_saved_values(mish_session):
    """What the backward needs is saved through autograd, as for PyTorch's own functions: a second backward works with
    retain_graph (it failed with a TypeError), a saved value changed in place since the forward is an error, not a
    wrong gradient, and an output the backward does not read may change (as for torch.sin's)."""
    x = torch.rand(*SHAPE, requires_grad=True)
    y = mish_session.module(x)
    upstream = torch.randn(*SHAPE)
    (first,) = torch.autograd.grad(y, x, upstream, retain_graph=True)
    (second,) = torch.autograd.grad(y, x, upstream)
    torch.testing.assert_close(first, second)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(y, x, upstream)
    h = x * 1  # Mish's backward reads its input
    y = mish_session.module(h)
    h.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward(upstream)
    assert "__return" not in mish_session._states[-1].runner.saved_names
    y = mish_session.module(x)
    y.mul_(2)
    (doubled,) = torch.autograd.grad(y, x, upstream)
    torch.testing.assert_close(doubled, 2 * first)


def test_a_step_keeps_no_output_buffer_once_its_results_are_released(monkeypatch):
    """DaCe keeps the arguments of a binary's first call from Python (the session's check), our pooled output
    buffers among them: with two steps holding four, every later call took fresh memory and paid its page faults."""
    monkeypatch.setenv("DCNB_NATIVE", "0")  # the Python calls, where DaCe's __call__ takes the first
    x = torch.rand(2, memory.limits()[0] // 8)  # outputs and gradients of 4 MiB: pooled
    session = dcnb.optimize(Mish(), x, baselines=(), time_budget=0.0)
    session.apply("map_fusion")
    x.requires_grad_()
    session.module(x).backward(torch.ones_like(x))
    x.grad = None
    pooled = [in_use for nbytes, in_use in memory.pooled() if nbytes == x.numel() * 4]
    assert pooled and not any(pooled)


def test_step_tables_print_outside_jupyter(mish_session):
    text = str(mish_session)
    assert "dcnb session: Mish (2x4x16x16) on cpu" in text
    assert "tasklet_fusion" in text and "vectorization" in text and "interm. MiB" in text
    report = mish_session.current.as_text()
    for column in ("Min", "Mean", "Median", "Stdev", "Max", "dcnb", "torch"):
        assert column in report


def test_torch_compile_is_a_baseline():
    session = dcnb.optimize(TinyMLP(), torch.randn(4, 16), time_budget=0.1)
    step = session.current
    assert set(step.timings) == {"dcnb", "torch", "torch_compile"}, step.notes
    assert step.speedup("torch_compile") > 0


def test_a_step_transforms_the_forward_in_a_process_of_its_own_while_it_transforms_the_backward(
    fresh_cache, monkeypatch, tmp_path
):
    # on a 12-layer transformer each side's transformation takes a minute (ViT-B/16's auto_optimize: 48 s for the
    # forward, 77 s for the backward, one after the other until the forward's got a forked process of its own)
    monkeypatch.setattr(build, "_loaded", {})  # every step here compiles: none was loaded before in this process
    session = dcnb.optimize(Mish(), torch.rand(2, 3, 6, 5), baselines=(), time_budget=0.05)
    log = tmp_path / "log"  # both processes append to it: "<event> <side> <pid>"
    run = session_module._run

    def logged(*event: object) -> None:
        with log.open("a") as f:
            f.write(" ".join(map(str, event)) + "\n")

    def recorded_run(action, sdfg, *args, **kwargs):
        side = "backward" if "backward" in sdfg.name else "forward"
        logged("start", side, os.getpid())
        if side == "backward":  # done only once the forward's has begun: one after the other, it never would
            deadline = time.monotonic() + 20
            while "start forward" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.01)
        count = run(action, sdfg, *args, **kwargs)
        logged("end", side, os.getpid(), count)
        return count

    forward_before = session.forward_sdfg.hash_sdfg()
    _record_compiles_and_waits(monkeypatch, logged)
    monkeypatch.setattr(session_module, "_run", recorded_run)
    step = session.apply("map_fusion")
    assert step.ok and step.compile_seconds > 0, step.error
    events = [line.split() for line in log.read_text().splitlines()]
    pids = {side: int(pid) for event, side, pid, *_ in events if event in ("start", "end")}
    counts = {side: int(rest[0]) for event, side, _, *rest in events if event == "end"}
    assert pids["backward"] == os.getpid() and pids["forward"] != os.getpid()
    order = [e[:2] for e in events]
    assert order.index(["start", "forward"]) < order.index(["end", "backward"])
    # the backward's compile (the longer) starts before the step waits for the forward, and the forward's after it
    assert order.index(["compile", "backward"]) < order.index(["wait", "forward"]) < order.index(["compile", "forward"])
    # the forward came back from its process transformed, with its count: it is what was compiled and checked
    assert counts["forward"] > 0 and step.applied == counts["forward"] + counts["backward"]
    assert session.forward_sdfg.hash_sdfg() != forward_before


def _record_compiles_and_waits(monkeypatch, logged) -> None:
    """``logged("compile", side, pid)`` as a side's compile starts, ``logged("wait", "forward", pid)`` as the step
    waits for the forward's process."""
    start, waited = build._Compiles.start, forked.Child.waited

    def recorded_start(self, sdfg, *args):
        logged("compile", "backward" if "backward" in sdfg.name else "forward", os.getpid())
        return start(self, sdfg, *args)

    def recorded_waited(self):
        logged("wait", "forward", os.getpid())
        return waited(self)

    monkeypatch.setattr(build._Compiles, "start", recorded_start)
    monkeypatch.setattr(forked.Child, "waited", recorded_waited)


def test_a_replay_after_a_step_before_autodiff_redoes_the_later_steps_on_both_sides_at_once(
    fresh_cache, monkeypatch, tmp_path
):
    # tasklet_fusion works before autodiff: the backward is made again, and every step after autodiff is applied
    # to both sides again (as a recipe's replay does), the forward's in a process of its own
    monkeypatch.setattr(build, "_loaded", {})  # every step here compiles: none was loaded before in this process
    session = dcnb.optimize(Mish(), torch.rand(2, 4, 16, 16), baselines=(), time_budget=0.05)
    assert session.apply("vectorization").ok
    log = tmp_path / "log"
    run = session_module._run

    def logged(*event: object) -> None:
        with log.open("a") as f:
            f.write(" ".join(map(str, event)) + "\n")

    def recorded_run(action, sdfg, *args, **kwargs):
        side = "pre" if action.before_autodiff else "backward" if "backward" in sdfg.name else "forward"
        logged("start", side, os.getpid(), action.name)
        if side == "backward":  # done only once the forward's has begun: one after the other, it never would
            deadline = time.monotonic() + 20
            while "start forward" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.01)
        count = run(action, sdfg, *args, **kwargs)
        logged("end", side, os.getpid(), action.name, count)
        return count

    _record_compiles_and_waits(monkeypatch, logged)
    monkeypatch.setattr(session_module, "_run", recorded_run)
    step = session.apply("tasklet_fusion")
    assert step.ok, step.error
    events = [line.split() for line in log.read_text().splitlines()]
    order = [e[:2] for e in events]
    runs = {(e[1], e[3]): int(e[2]) for e in events if e[0] == "start"}
    assert runs[("pre", "tasklet_fusion")] == os.getpid()
    assert runs[("backward", "vectorization")] == os.getpid() and runs[("forward", "vectorization")] != os.getpid()
    assert order.index(["start", "forward"]) < order.index(["end", "backward"])
    assert order.index(["compile", "backward"]) < order.index(["wait", "forward"]) < order.index(["compile", "forward"])
    # vectorization matched again, so it stays in the recipe
    counts = {(e[1], e[3]): int(e[4]) for e in events if e[0] == "end"}
    assert counts[("forward", "vectorization")] + counts[("backward", "vectorization")] > 0
    assert not [note for note in step.notes if "matches nothing now" in note]
    # the step's own action stays last
    assert [entry["name"] for entry in session.recipe] == ["vectorization", "tasklet_fusion"]
