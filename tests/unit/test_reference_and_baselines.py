"""The session's reference (PyTorch's run, and the check of a candidate against it) and its baselines (eager and
torch.compile, timed beside a step), on plain PyTorch modules (no compiles)."""

import pytest
import torch
from torch import nn

import dcnb
from dcnb._src import structure, timing, verify


class _Drifting(nn.Module):
    """The module's own result on its first call, off by ``by`` from the second on (what a binary that zeroes an
    accumulator once does)."""

    def __init__(self, module: nn.Module, by: float):
        super().__init__()
        self.module, self.by, self.calls = module, by, 0

    def forward(self, x):
        self.calls += 1
        return self.module(x) + (self.by if self.calls > 1 else 0.0)


def _reference(module: nn.Module, x: torch.Tensor, backward: bool = True) -> verify.Reference:
    call = structure.Call.of([x], {})
    outputs, _ = verify.eager(module, [x], call)
    return verify.Reference(module, [x], call, outputs, ["x"], backward=backward, training=False)


def test_a_candidate_is_checked_on_two_runs_and_float64_is_asked_only_past_the_tolerance():
    torch.manual_seed(0)
    linear = nn.Linear(4, 3)
    reference = _reference(linear, torch.randn(2, 4))
    assert reference.upstream is not None and set(reference.expected.tensors) == {
        "output", "grad x", "grad weight", "grad bias"
    }
    same = _Drifting(linear, 0.0)
    assert reference.check(same).ok and same.calls == 2
    assert reference._exact is None and reference._other_order is None  # nothing was past the tolerance
    # the second run differs: it is judged (and fails), though the first passed
    drifting = _Drifting(linear, 1.0)
    result = reference.check(drifting)
    assert not result.ok and result.worst == "output" and drifting.calls == 2 and "output differs" in result.message
    exact = reference._exact
    assert exact is not None and exact.tensors["output"].dtype == torch.float64
    # a candidate failing its first run runs once; the float64 run and PyTorch's run in another order of summation
    # (one thread) are made once per reference, and the session's number of threads is restored
    other = reference._other_order
    assert other is not None and other.tensors.keys() == reference.expected.tensors.keys()
    threads = torch.get_num_threads()
    wrong = _Drifting(lambda x: linear(x) * 2, 0.0)
    assert not reference.check(wrong).ok and wrong.calls == 1
    assert reference._exact is exact and reference._other_order is other and torch.get_num_threads() == threads
    assert linear.weight.grad is None  # the user's module is left as it was


def test_without_a_backward_only_outputs_are_compared():
    reference = _reference(nn.Linear(4, 3), torch.randn(2, 4), backward=False)
    assert reference.upstream is None and set(reference.expected.tensors) == {"output"}


def test_a_module_failing_eagerly_or_with_inputs_that_require_gradients_says_so():
    class Failing(nn.Module):
        def forward(self, x):
            raise ValueError("no")

    class Numpy(nn.Module):  # fine without gradients, refused with them
        def forward(self, x):
            return torch.from_numpy(x.numpy() * 2)

    x = torch.randn(3)
    with pytest.raises(dcnb.InputError, match="running Failing on the example inputs failed"):
        verify.eager(Failing(), [x], structure.Call.of([x], {}))
    with pytest.raises(dcnb.InputError, match="inputs requiring gradients"):
        _reference(Numpy(), x)


class _Counted(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear, self.calls = nn.Linear(4, 4), 0

    def forward(self, x):
        self.calls += 1
        return self.linear(x)


def test_baselines_are_warmed_up_once_per_session_and_timed_beside_the_candidate():
    module, candidate = _Counted(), _Counted()
    reference = _reference(module, torch.randn(2, 4))
    module.calls = 0
    baselines = timing.Baselines(("torch",), reference, "cpu", 0.0, lambda message: None)
    timings, notes = baselines.time(candidate)
    assert set(timings) == {"dcnb", "torch"} and all(t.runs == 3 for t in timings.values())
    assert (candidate.calls, module.calls) == (3, 4)  # the baseline's warm-up; the candidate's check ran it
    assert all(note.startswith(timing.NOISE_NOTE) for note in notes)
    baselines.time(candidate)
    assert (candidate.calls, module.calls) == (6, 7)
    assert module.linear.weight.grad is None  # timed under verify.preserved


def test_a_torch_compile_that_fails_is_dropped_from_the_baselines_with_a_note(monkeypatch):
    def failing(module):
        raise RuntimeError("no compiler")

    monkeypatch.setattr(torch, "compile", failing)
    heard = []
    reference = _reference(nn.Linear(4, 4), torch.randn(2, 4))
    baselines = timing.Baselines(("torch", "torch_compile"), reference, "cpu", 0.0, heard.append)
    timings, notes = baselines.time(reference.module)
    assert set(timings) == {"dcnb", "torch"} and heard == ["compiling the torch.compile baseline", "timing"]
    assert notes[0] == "torch.compile baseline unavailable: RuntimeError: no compiler"
    assert baselines.names == ("torch",)
    timings, notes = baselines.time(reference.module)
    assert not any("torch.compile" in note for note in notes) and len(heard) == 2


def test_the_timed_call_runs_forward_and_backward_on_copies_of_the_inputs():
    x = torch.randn(2, 4)
    linear = nn.Linear(4, 4)
    baselines = timing.Baselines((), _reference(linear, x), "cpu", 0.0, lambda message: None)
    baselines.call(linear)()
    assert linear.weight.grad is not None and x.grad is None and not x.requires_grad
    other = nn.Linear(4, 4)
    forward_only = timing.Baselines((), _reference(other, x, backward=False), "cpu", 0.0, lambda message: None)
    forward_only.call(other)()
    assert other.weight.grad is None
