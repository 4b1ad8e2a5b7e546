"""One test per DaCe gap fixed in dcnb/_src/opfixes.py: each fails without its fix."""

import pytest
import torch

import dcnb
from models import TinyMLP

pytestmark = pytest.mark.compile


def test_einsum_backward_of_transients():
    # a Linear whose input is another op's output: DaCe's Einsum backward made an invalid SDFG for it
    session = dcnb.optimize(TinyMLP(), torch.randn(8, 16), baselines=(), time_budget=0.05)
    step = session.current
    assert step.ok and step.check.ok
    assert {"grad x", "grad fc1.weight", "grad fc2.bias"} <= set(step.check.errors)
