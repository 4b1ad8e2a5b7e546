"""Expansions written as DaCe programs are parsed once per signature (dcnb/_src/fixes/programs.py)."""

import pytest
import torch
from torch import nn

import dcnb
from dcnb._src import events

pytestmark = pytest.mark.compile


def _block(eps: float) -> nn.Module:
    # GroupNorm, exported as InstanceNormalization: expanded before autodiff, in this process (BatchNorm has a
    # backward rule of its own and expands at code generation)
    block = nn.Sequential(nn.GroupNorm(2, 4), nn.ReLU(), nn.GroupNorm(2, 4), nn.GroupNorm(2, 4, eps=eps))
    with torch.no_grad():
        for norm in block[0], block[2], block[3]:
            norm.weight.normal_(1.0, 0.2)
            norm.bias.normal_(0.0, 0.2)
    return block


def test_alike_normalizations_parse_once_and_unlike_ones_apart():
    torch.manual_seed(0)
    # the third normalization differs in its epsilon only: a copy of the first's program would compute it wrong,
    # which the step's check against PyTorch would catch
    with events.count() as counted:
        session = dcnb.optimize(_block(eps=0.5), torch.randn(3, 4, 5, 7), baselines=(), time_budget=0.01)
    assert session.current.ok and session.current.check.ok, session.current.error
    assert counted["parse"] == 2
