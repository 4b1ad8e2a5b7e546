"""tasklet_fusion merges a chain whose value several tasklets read (a bias add feeding GELU), on real builds."""

import pytest
import torch
from dace.sdfg import nodes

import dcnb

pytestmark = pytest.mark.compile


def test_a_bias_add_read_twice_by_gelu_is_merged_and_not_stored():
    torch.manual_seed(0)
    nn = torch.nn
    # the Linear's bias add is read twice by GELU's h * (1 + erf(h / sqrt 2)) / 2: once fused into one map, DaCe's
    # TaskletFusion left it inside the map, which its autodiff cannot store, and the step failed
    module = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
    session = dcnb.optimize(module, torch.randn(4, 8, 32), baselines=(), time_budget=0.0)
    naive = session.current.intermediate_bytes
    step = session.apply("tasklet_fusion")
    assert step.ok and step.check.ok, step.error
    # the pre-activation is recomputed in the backward from the product and the bias (4 x 8 x 64 floats fewer)
    assert step.intermediate_bytes <= naive - 4 * 8 * 64 * 4
    forward = session.forward_sdfg
    inside = [
        n.data
        for n, state in forward.all_nodes_recursive()
        if isinstance(n, nodes.AccessNode) and state.entry_node(n) is not None
    ]
    assert not inside
