"""fuse_rows: Softmax and LayerNorm, forward and backward, as parallel maps over rows without atomics."""

import math

import pytest
import torch
from dace.sdfg import nodes
from torch import nn

import dcnb
from tests.cpu_sources import cpu_source

pytestmark = pytest.mark.compile


@pytest.mark.parametrize(
    "module, shape, backward_kernels",
    [
        (nn.Softmax(dim=-1), (4, 64, 32), 1),
        # the row map in chunks and a walk by column tiles over each of the weight and bias gradients' partial sums
        # (LayerNorm's backward rule, their one writer, writes them in place: passes.after_autodiff)
        (nn.LayerNorm(32), (4, 64, 32), 3),
        # 131 columns split into no tile of 16 or more: the gradients' column sums take DaCe's loop per column
        (nn.LayerNorm(131), (2, 3, 131), 3),
    ],
)
def test_rows_fuse_into_parallel_maps_and_stay_right(module, shape, backward_kernels):
    torch.manual_seed(0)
    session = dcnb.optimize(module, torch.randn(*shape), baselines=(), time_budget=0.0)
    assert {o.name: o.matches for o in session.actions()}["fuse_rows"] > 0
    step = session.apply("fuse_rows")
    assert step.ok and step.check.ok, step.error
    assert step.counts["forward"]["kernels"] == 1
    assert step.counts["backward"]["kernels"] == backward_kernels
    backward = session.backward_sdfg.all_nodes_recursive()
    tiles = [n for n, _ in backward if isinstance(n, nodes.MapEntry) and n.label == "column_tiles"]
    assert len(tiles) == (2 if shape[-1] == 32 and isinstance(module, nn.LayerNorm) else 0)
    runner = session._states[-1].runner
    for binary in (runner.forward_binary, runner.backward_binary):
        code = cpu_source(binary)
        assert "reduce_atomic" not in code and "#pragma omp parallel for" in code
    # a row's maximum runs as a vector loop (OpenMP may reassociate it, GCC alone may not)
    assert ("#pragma omp simd reduction(max:" in cpu_source(runner.forward_binary)) is isinstance(module, nn.Softmax)


def _row_passes(sdfg, columns: int) -> int:
    """Loops over a row inside the row map: maps over its columns and row reductions of their own."""
    count = 0
    for node, state in sdfg.all_nodes_recursive():
        if state is None or state.entry_node(node) is None:
            continue
        if isinstance(node, nodes.MapEntry) and len(node.map.params) == 1:
            count += node.map.range.num_elements() == columns
        count += isinstance(node, nodes.Tasklet) and node.label == "reduce_row"
    return count


def test_a_row_is_read_in_as_few_passes_as_a_hand_written_kernel():
    """Softmax forward: the maximum; exp(x - max) with its sum in the same loop; the division. Backward: y * dy with
    its sum; the gradient. (Each operation a pass of its own: 5 and 4; sums after their terms: 4 and 3.)"""
    torch.manual_seed(0)
    session = dcnb.optimize(nn.Softmax(dim=-1), torch.randn(4, 64, 32), baselines=(), time_budget=0.0)
    step = session.apply("fuse_rows")
    assert step.ok and step.check.ok, step.error
    assert _row_passes(session.forward_sdfg, 32) == 3
    assert _row_passes(session.backward_sdfg, 32) == 2


def test_column_sums_fold_into_the_row_map_as_partial_sums():
    """LayerNorm's weight and bias gradients are summed per chunk of rows inside the row map, so that the backward
    keeps no temporary as large as the input (it wrote dY * x_hat in full, to sum it afterwards)."""
    torch.manual_seed(0)
    shape = (4, 64, 64)
    session = dcnb.optimize(nn.LayerNorm(64), torch.randn(*shape), baselines=(), time_budget=0.0)
    step = session.apply("fuse_rows")
    assert step.ok and step.check.ok, step.error
    backward = session.backward_sdfg
    transients = {name: desc.shape for name, desc in backward.arrays.items() if desc.transient}
    assert not [name for name, s in transients.items() if math.prod(s) == math.prod(shape)], transients
    partials = [s for name, s in transients.items() if name.endswith("_partials")]
    assert partials == [(64, 64), (64, 64)], transients
    assert step.counts["backward"]["kernels"] == 3
    # the gradients are written once each, so the module hands the compiled code empty arrays, not zeroed ones
    assert not session._states[-1].runner._accumulated


class _TwoResidualNorms(nn.Module):
    """A BERT layer's shape in small: of its two LayerNorms after residual adds, DaCe kept the first's backward as
    a nested SDFG."""

    def __init__(self):
        super().__init__()
        self.inner, self.outer = nn.Linear(32, 32), nn.Linear(32, 32)
        self.first, self.second = nn.LayerNorm(32), nn.LayerNorm(32)

    def forward(self, x):
        a = self.first(self.inner(x) + x)
        return self.second(self.outer(a) + a)


@pytest.mark.deep
def test_a_norm_left_nested_becomes_rows_too():
    torch.manual_seed(0)
    session = dcnb.optimize(_TwoResidualNorms(), torch.randn(4, 8, 32), baselines=(), time_budget=0.0)
    step = session.apply("fuse_rows")
    assert step.ok and step.check.ok, step.error
    backward = session.backward_sdfg
    nested = [
        n.sdfg for n, s in backward.all_nodes_recursive() if isinstance(n, nodes.NestedSDFG) and s.sdfg is backward
    ]
    for sdfg in nested:
        # the row map and the column tiles of the weight's and the bias's gradients (16 maps over whole tensors before)
        tops = [
            n for s in sdfg.states() for n in s.nodes() if isinstance(n, nodes.MapEntry) and s.entry_node(n) is None
        ]
        assert len(tops) <= 3, [n.label for n in tops]
    # both norms' weight and bias gradients as column tiles, the first's nested or (its gradient read where the sum's
    # backward left it: after_autodiff.shared_gradients) inlined with the rest
    tiles = [n for n, _ in backward.all_nodes_recursive() if isinstance(n, nodes.MapEntry) and n.label == "column_tiles"]
    assert len(tiles) >= 4, [n.label for n, _ in backward.all_nodes_recursive() if isinstance(n, nodes.MapEntry)]


class _StoredProduct(nn.Module):
    """silu(x) * x: the forward keeps x * sigmoid(x) for the backward, written by a map that vectorization made and
    that fuse_rows fuses with the product after it."""

    def forward(self, x):
        return nn.functional.silu(x) * x


def test_rows_of_vectorized_maps_keep_their_last_vector():
    # vectorized maps' memlets propagated to 0:57 of a row of 64: the fused map passed values in a transient of 57
    # elements and stored 57 of each row, the backward read the other 7 unwritten (grad x off by up to 1e37)
    torch.manual_seed(0)
    session = dcnb.optimize(_StoredProduct(), torch.randn(8, 8, 64), baselines=(), time_budget=0.0)
    assert session.apply("vectorization").ok
    forward = session.forward_sdfg
    # what the vectorized maps read and write, as propagated outside them: whole rows
    outer = [
        e.data.subset
        for state in forward.states()
        for n in state.nodes()
        if isinstance(n, (nodes.MapEntry, nodes.MapExit)) and n.map.range[-1][2] > 1
        for e in (state.in_edges(n) if isinstance(n, nodes.MapEntry) else state.out_edges(n))
        if not e.data.is_empty()
    ]
    step = session.apply("fuse_rows")
    assert step.ok and step.check.ok, step.error
    assert outer and all(s.size()[-1] == 64 for s in outer), [str(s) for s in outer]
