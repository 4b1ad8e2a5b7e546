"""tasklet_fusion merges a chain whose value several tasklets read (a bias add feeding GELU), on real builds."""

import pytest
import torch
from dace.sdfg import nodes

import dcnb

pytestmark = pytest.mark.compile


class _TanhGelu(torch.nn.Module):
    """GPT-2's GELU after a Linear of a matrix (a Gemm whose bias add is a map): h is read three times, and MapFusion
    passes it on through copies of its own, one of them read twice."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(32, 64)

    def forward(self, x):
        h = self.linear(x)
        return 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * torch.pow(h, 3.0))))


@pytest.mark.parametrize(
    "module,x",
    [
        (torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)), torch.randn(4, 8, 32)),
        (_TanhGelu(), torch.randn(32, 32)),
    ],
    ids=["erf_gelu", "tanh_gelu"],
)
def test_a_bias_add_gelu_reads_again_is_merged_and_not_stored(module, x):
    torch.manual_seed(0)
    # the Linear's bias add is read twice by GELU's h * (1 + erf(h / sqrt 2)) / 2: once fused into one map, DaCe's
    # TaskletFusion left it inside the map, which its autodiff cannot store, and the step failed
    session = dcnb.optimize(module, x, baselines=(), time_budget=0.0)
    naive = session.current.intermediate_bytes
    step = session.apply("tasklet_fusion")
    assert step.ok and step.check.ok, step.error
    # the pre-activation is recomputed in the backward from the product and the bias (32 x 64 floats fewer)
    assert step.intermediate_bytes <= naive - 32 * 64 * 4
    forward = session.forward_sdfg
    inside = [
        n.data
        for n, state in forward.all_nodes_recursive()
        if isinstance(n, nodes.AccessNode) and state.entry_node(n) is not None
    ]
    assert not inside
    # the merged tasklet reads the product once, so its gradient is written once, not zeroed and added into twice
    for n, state in forward.all_nodes_recursive():
        if isinstance(n, nodes.Tasklet) and state.entry_node(n) is not None:
            reads = [(e.data.data, str(e.data.subset)) for e in state.in_edges(n) if e.data.data is not None]
            assert len(reads) == len(set(reads)), n.code.as_string
    zeroing = [
        n.map.label for n, _ in session.backward_sdfg.all_nodes_recursive()
        if isinstance(n, nodes.MapEntry) and n.map.label.startswith("zero_gradient")
    ]
    assert not zeroing
