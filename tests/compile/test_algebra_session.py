"""simplify_algebra in real sessions: Mish with one exp forward and backward, refusals with their reasons."""

import pytest
import torch
import torch.nn.functional as F
from dace.sdfg import nodes
from torch import nn

import dcnb
from dcnb._src.actions import algebra
from tests.models import Mish

pytestmark = pytest.mark.compile

SHAPE = (2, 4, 8, 8)


class SiLU(nn.Module):
    def forward(self, x):
        return F.silu(x)


def _tasklet_codes(sdfg):
    return [n.code.as_string for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nodes.Tasklet)]


@pytest.fixture
def fused():  # the build cache makes the second one cheap
    torch.manual_seed(0)
    session = dcnb.optimize(Mish(), torch.rand(*SHAPE), baselines=(), time_budget=0.05)
    assert session.apply("tasklet_fusion").ok
    return session


def test_mish_forward_and_backward_compute_one_exp_and_stay_right_at_extremes(fused):
    assert {o.name: o.matches for o in fused.actions()}["simplify_algebra"] == 2
    step = fused.apply("simplify_algebra")
    assert step.ok and step.applied == 2 and step.check.ok, step.error
    assert fused.recipe[-1] == {"name": "simplify_algebra"}
    for sdfg in (fused.forward_sdfg, fused.backward_sdfg):
        [code] = _tasklet_codes(sdfg)
        assert algebra.calls(code) == 1
    # far beyond where e^x overflows, and tiny: PyTorch's Mish in float64 is the reference
    values = [-1e4, -100.0, -50.0, -20.0, -1.0, -1e-30, 0.0, 1e-30, 0.5, 20.0, 50.0, 100.0, 1e4]
    x = torch.tensor(values * (torch.Size(SHAPE).numel() // len(values) + 1))[: torch.Size(SHAPE).numel()]
    x = x.reshape(SHAPE).requires_grad_()
    fused.module(x).backward(torch.ones(SHAPE))
    x64 = x.detach().double().requires_grad_()
    want = F.mish(x64)
    want.backward(torch.ones(SHAPE, dtype=torch.float64))
    torch.testing.assert_close(fused.module(x).detach().double(), want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)


def test_a_rewrite_that_overflows_is_refused_and_the_session_stays(fused):
    before = fused.current
    step = fused.apply("simplify_algebra", form="exp")
    assert not step.ok and fused.current is before
    assert "every rewrite loses accuracy" in step.error and "gives __out = nan" in step.error


def test_silu_has_nothing_to_simplify_and_says_why():
    session = dcnb.optimize(SiLU(), torch.rand(*SHAPE), baselines=(), time_budget=0.05)
    assert {o.name: o.matches for o in session.actions()}["simplify_algebra"] == 0
    step = session.apply("simplify_algebra")
    assert not step.ok and "more than one transcendental call" in step.error
