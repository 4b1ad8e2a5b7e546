"""Gradients one map writes element by element are written, not accumulated: the runner skips zeroing them."""

import pytest
import torch
import torch.nn.functional as F

import dcnb
from dcnb._src import program
from models import Mish

pytestmark = pytest.mark.compile

SHAPE = (2, 4, 8, 8)


def test_a_fused_backward_overwrites_its_gradient_and_needs_no_zeros():
    torch.manual_seed(0)
    x = torch.rand(*SHAPE)
    session = dcnb.optimize(Mish(), x, baselines=(), time_budget=0.05)
    # naive: two maps add into gradient_x, so it must start at zero
    assert not program.overwritten(session.backward_sdfg, "gradient_x")
    for name in ("tasklet_fusion", "vectorization"):
        assert session.apply(name).ok
        runner = session._states[-1].runner
        assert program.overwritten(session.backward_sdfg, "gradient_x") and not runner._accumulated
        # whatever the buffer held before does not leak into the gradient
        upstream = torch.randn(*SHAPE)
        garbage = torch.full(SHAPE, float("nan"))
        runner.backward_binary(x=x, gradient___return=upstream, gradient_x=garbage)
        x64 = x.double().requires_grad_()
        F.mish(x64).backward(upstream.double())
        torch.testing.assert_close(garbage.double(), x64.grad, rtol=1e-5, atol=1e-6)
