"""Gradients one map writes element by element are written, not accumulated: the runner skips zeroing them."""

import dace
import pytest
import torch
import torch.nn.functional as F
from dace.sdfg import nodes

import dcnb
from dcnb._src.passes import gradient_writes
from tests.models import Mish

pytestmark = pytest.mark.compile

SHAPE = (2, 4, 8, 8)


def test_a_fused_backward_overwrites_its_gradient_and_needs_no_zeros():
    torch.manual_seed(0)
    x = torch.rand(*SHAPE)
    session = dcnb.optimize(Mish(), x, baselines=(), time_budget=0.05)
    # naive: two maps add into gradient_x, so it must start at zero
    assert not gradient_writes.Writes(session.backward_sdfg).overwritten("gradient_x")
    for name in ("tasklet_fusion", "vectorization"):
        assert session.apply(name).ok
        runner = session._states[-1].runner
        assert gradient_writes.Writes(session.backward_sdfg).overwritten("gradient_x") and not runner._accumulated
        # whatever the buffer held before does not leak into the gradient
        upstream = torch.randn(*SHAPE)
        garbage = torch.full(SHAPE, float("nan"))
        runner.backward_binary(x=x, gradient___return=upstream, gradient_x=garbage)
        x64 = x.double().requires_grad_()
        F.mish(x64).backward(upstream.double())
        torch.testing.assert_close(garbage.double(), x64.grad, rtol=1e-5, atol=1e-6)


def test_a_row_map_overwrites_its_gradient():
    """fuse_rows writes Softmax's input gradient from a map over the rows around one over the columns: every element
    once, so no zeros either (LayerNorm's, in chunks of rows: test_rows.py)."""
    torch.manual_seed(0)
    x = torch.randn(8, 16, 32)
    session = dcnb.optimize(torch.nn.Softmax(dim=-1), x, baselines=(), time_budget=0.05)
    assert session.apply("fuse_rows").ok
    assert gradient_writes.Writes(session.backward_sdfg).overwritten("gradient_input")
    runner = session._states[-1].runner
    upstream = torch.randn(*x.shape)
    garbage = torch.full(x.shape, float("nan"))
    y = torch.softmax(x, -1)
    runner.backward_binary(__return=y, gradient___return=upstream, gradient_input=garbage)
    x64 = x.double().requires_grad_()
    torch.softmax(x64, -1).backward(upstream.double())
    torch.testing.assert_close(garbage.double(), x64.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tiles, covers", [(("4*c", "4*c + 3"), True), (("4*c", "4*c + 2"), False)])
def test_rows_in_chunks_cover_the_array_only_without_gaps(tiles, covers):
    chunks = nodes.Map("chunks", ["c"], dace.subsets.Range([(0, 3, 1)]))
    rows = nodes.Map("rows", ["r"], dace.subsets.Range([tuple(dace.symbolic.pystr_to_symbolic(t) for t in tiles) + (1,)]))
    columns = nodes.Map("columns", ["i"], dace.subsets.Range([(0, 7, 1)]))
    element = dace.subsets.Range.from_string("r, i")
    assert gradient_writes.rows_cover(element, [columns, rows, chunks], (16, 8)) is covers


class _Residual(torch.nn.Module):
    """Gradients that add up from a nested SDFG (LayerNorm's backward, a matrix product's) and from a map."""

    def __init__(self):
        super().__init__()
        self.linear, self.norm = torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)

    def forward(self, x):
        h = self.linear(x)
        return self.norm(h) + h * x


def test_temporaries_a_nested_gradient_writes_whole_are_not_zeroed():
    torch.manual_seed(0)
    session = dcnb.optimize(_Residual(), torch.randn(4, 8, 16), baselines=(), time_budget=0.0)
    assert session.current.ok and session.current.check.ok
    backward = session._states[-1].sdfgs.backward
    parts = [
        n for n, _ in backward.all_nodes_recursive() if isinstance(n, nodes.AccessNode) and n.data.endswith("_part")
    ]
    # each a whole output of the LayerNorm's or the product's backward (the product's written, no longer added)
    assert parts and not any(n.setzero for n in parts)
    zeroing = [n.label for n, _ in session.backward_sdfg.all_nodes_recursive() if isinstance(n, nodes.MapEntry)]
    assert not any(label.startswith("zero_gradient") and "_part" in label for label in zeroing)


class _Gelu(torch.nn.Module):
    def forward(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / 1.4142135623730951))


def test_accumulators_one_map_fills_are_written_not_zeroed():
    torch.manual_seed(0)
    session = dcnb.optimize(_Gelu(), torch.randn(4, 8, 16), baselines=(), time_budget=0.0)
    assert session.current.ok and session.current.check.ok
    backward = session._states[-1].sdfgs.backward
    zeroed = {n.data for n, _ in backward.all_nodes_recursive() if isinstance(n, nodes.AccessNode) and n.setzero}
    # the gradients of erf's and of the division's outputs: each added into by one map, element by element
    assert not {name for name in zeroed if "Erf" in name or "Div" in name}, zeroed


def test_a_gradient_a_nested_backward_alone_writes_whole_is_written_in_place():
    # a convolution's and a BatchNorm's backward (nested SDFGs) are each the one writer of their input's gradient:
    # written into a temporary and added into the gradient by a map, a full-size ResNet-50's backward spent 34 of its
    # 400 ms on those passes
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    session = dcnb.optimize(module.train(), x, training=True, baselines=(), time_budget=0.0)
    assert session.current.ok and session.current.check.ok, session.current.error
    backward = session._states[-1].sdfgs.backward
    maps = [n.label for n, _ in backward.all_nodes_recursive() if isinstance(n, nodes.MapEntry)]
    assert not [label for label in maps if label.startswith("accumulate_")], maps


class _Skip(torch.nn.Module):
    """A residual block: the input's gradient is the sum's gradient plus the branch's. Differentiated in eval mode:
    in training mode the norm adds the sum and writes its ReLU itself (``on_import.activations_into_norms``)."""

    def __init__(self):
        super().__init__()
        self.conv, self.norm = torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.BatchNorm2d(4)

    def forward(self, x):
        h = torch.relu(x)
        return torch.relu(self.norm(self.conv(h)) + h)


def test_a_sum_s_inputs_read_its_gradient_instead_of_copies():
    # autodiff copies a sum's gradient into a gradient of each input: the branch's (the norm's output's, which
    # nothing else writes) is the sum's itself now, under the branch's name (the norm's backward is named by it)
    torch.manual_seed(0)
    session = dcnb.optimize(_Skip().eval(), torch.randn(2, 4, 8, 8), baselines=(), time_budget=0.0)
    assert session.current.ok and session.current.check.ok, session.current.error
    backward = session._states[-1].sdfgs.backward
    assert "gradient_SLASHAdd_output_0" not in backward.arrays
    [(node, state)] = [
        (n, s) for n, s in backward.all_nodes_recursive()
        if isinstance(n, nodes.AccessNode) and n.data == "gradient_SLASHnormSLASHBatchNormalization_output_0"
    ]
    # written by the last ReLU's backward, read by the norm's: no copy between
    assert [e.src.label for e in state.in_edges(node)] == ["SLASHRelu_1_backward_expansion"]
    assert "SLASHnormSLASHBatchNormalization_backward_expansion" in {e.dst.label for e in state.out_edges(node)}


def test_a_residual_input_s_gradient_is_written_as_one_sum():
    # h's gradient is the sum's gradient plus the branch's part: zeroed, a copy added, the part added (three passes
    # over it); one map now writes the part plus the sum's gradient, and the sum's backward is gone
    torch.manual_seed(0)
    session = dcnb.optimize(_Skip().eval(), torch.randn(2, 4, 8, 8), baselines=(), time_budget=0.0)
    assert session.current.ok and session.current.check.ok, session.current.error
    backward = session._states[-1].sdfgs.backward
    [(node, state)] = [
        (n, s) for n, s in backward.all_nodes_recursive()
        if isinstance(n, nodes.AccessNode) and n.data == "gradient_SLASHRelu_output_0"
    ]
    [write] = state.in_edges(node)
    assert not node.setzero and all(e.data.wcr is None for e in state.memlet_path(write))
    tasklet = state.memlet_path(write)[0].src
    read = {e.data.data for e in state.in_edges(tasklet)}
    assert "gradient_SLASHnormSLASHBatchNormalization_output_0" in read, tasklet.code.as_string
    maps = [n.label for n, _ in backward.all_nodes_recursive() if isinstance(n, nodes.MapEntry)]
    assert "_Add__map" not in maps, maps
