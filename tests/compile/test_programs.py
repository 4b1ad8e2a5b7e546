"""Expansions written as DaCe programs, dcnb's and DaCe's own, are parsed once per signature
(dcnb/_src/fixes/programs.py)."""

import collections

import pytest
import torch
from torch import nn

import dcnb
from dcnb._src import cache, events
from dcnb._src.fixes import programs

pytestmark = pytest.mark.compile


def _parses(monkeypatch, *eps: float) -> int:
    """The programs parsed making the naive step of GroupNorms with these epsilons, a ReLU after the first (GroupNorm
    is exported as InstanceNormalization and ops around it, expanded before autodiff, in this process), none kept
    from before (parses are kept for the process)."""
    monkeypatch.setattr(programs, "_parsed", collections.OrderedDict())
    torch.manual_seed(0)
    norms = [nn.GroupNorm(2, 4, eps=e) for e in eps]
    with torch.no_grad():
        for norm in norms:
            norm.weight.normal_(1.0, 0.2)
            norm.bias.normal_(0.0, 0.2)
    block = nn.Sequential(norms[0], nn.ReLU(), *norms[1:])
    with events.count() as counted:
        session = dcnb.optimize(block, torch.randn(3, 4, 5, 7), baselines=(), time_budget=0.01)
    # a copy of another normalization's program would compute one of another epsilon wrong: the check catches it
    assert session.current.ok and session.current.check.ok, session.current.error
    return counted["parse"]


@pytest.mark.deep
def test_alike_expansions_parse_once_and_unlike_ones_apart(monkeypatch):
    one = _parses(monkeypatch, 1e-5)
    assert one >= 2  # the normalization's program (dcnb's) and DaCe's programs for the ops around it
    # a second normalization like the first parses nothing more, DaCe's ops around it neither; one that differs in
    # its epsilon only parses its own program again
    assert _parses(monkeypatch, 1e-5, 1e-5) == one
    assert _parses(monkeypatch, 1e-5, 1e-5, 0.5) == one + 1


class _Reshaped(nn.Module):
    """Two alike blocks whose ops DaCe's programs expand (Reshape, Add) and dcnb's (the normalization)."""

    def __init__(self):
        super().__init__()
        self.norms = nn.ModuleList([nn.GroupNorm(2, 4) for _ in range(2)])

    def forward(self, x):
        for norm in self.norms:
            x = torch.relu(norm(x)).reshape(3, 4, 35).reshape(3, 4, 5, 7) + 1.0
        return x


def test_a_step_is_built_alike_whatever_the_process_parsed_before(monkeypatch):
    # a kept parse's copy was named unlike a parse (the names of an inlined expansion's clashing arrays come from
    # it): the same step had other SDFGs, and build keys, in a process that had parsed its programs before
    def keys() -> list[str]:
        torch.manual_seed(0)
        state = dcnb.optimize(_Reshaped(), torch.randn(3, 4, 5, 7), baselines=(), time_budget=0.0)._states[-1]
        return [cache.key(sdfg, "cpu", {}) for sdfg in (state.sdfgs.forward, state.sdfgs.backward)]

    monkeypatch.setattr(programs, "_parsed", collections.OrderedDict())
    first = keys()
    assert len(programs._parsed) > 0
    assert keys() == first
