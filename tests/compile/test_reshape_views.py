"""Copies that move no element become views (passes/reshape_views.py): a transient copied whole into an array of
another shape, a permutation between arrays in one memory order."""

import dace
import numpy as np
import pytest
import torch

import dcnb
from dcnb._src.passes import reshape_views
from tests.compile.test_channels_last import _ConvNeXtBlock
from tests.cpu_sources import cpu_source

pytestmark = pytest.mark.compile


def test_auto_optimizes_products_over_images_write_their_results_in_place():
    # auto_optimize inlined the products of linear layers over (N, H, W, C) and copied each result matrix into its
    # image one element at a time, through divisions and remainders (ConvNeXt-T: 39% of the forward's samples)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    session = dcnb.optimize(module, torch.randn(2, 8, 8, 16), baselines=(), time_budget=0.0)
    step = session.apply("auto_optimize")
    assert step.ok and step.check.ok, step.error
    assert {"output", "grad 0.weight", "grad 2.weight", "grad input"} <= set(step.check.errors)
    runner = session._states[-1].runner
    for binary in (runner.forward_binary, runner.backward_binary):
        assert "py_mod(" not in cpu_source(binary)


def _copied(read: str = "a[i, j]", read_again: bool = False) -> dace.SDFG:
    """A (4, 8) transient written by a map from ``read`` (2x) and copied into the (32,) output; ``read_again``: a
    second map reads it too (3x, into ``again``)."""
    sdfg = dace.SDFG("copied")
    sdfg.add_array("a", [4, 8], dace.float32)
    sdfg.add_array("out", [32], dace.float32)
    sdfg.add_array("again", [4, 8], dace.float32)
    sdfg.add_transient("t", [4, 8], dace.float32)
    state = sdfg.add_state()
    t = state.add_access("t")
    state.add_mapped_tasklet(
        "twice", {"i": "0:4", "j": "0:8"}, {"__in": dace.Memlet(read)}, "__out = 2 * __in",
        {"__out": dace.Memlet("t[i, j]")}, external_edges=True, output_nodes={"t": t},
    )
    state.add_edge(t, None, state.add_write("out"), None, dace.Memlet("out[0:32]"))
    if read_again:
        state.add_mapped_tasklet(
            "thrice", {"i": "0:4", "j": "0:8"}, {"__in": dace.Memlet("t[i, j]")}, "__out = 3 * __in",
            {"__out": dace.Memlet("again[i, j]")}, external_edges=True, input_nodes={"t": t},
        )
    return sdfg


@pytest.mark.parametrize("read_again", [False, True], ids=["copied-only", "read-again"])
def test_a_transient_becomes_a_view_only_where_the_copy_is_its_one_reader(read_again):
    sdfg = _copied(read_again=read_again)
    assert reshape_views.copies_as_views(sdfg) == (0 if read_again else 1)
    assert isinstance(sdfg.arrays["t"], dace.data.View) != read_again
    a = np.arange(32, dtype=np.float32).reshape(4, 8).copy()
    out, again = np.zeros(32, np.float32), np.zeros((4, 8), np.float32)
    sdfg(a=a, out=out, again=again)
    np.testing.assert_allclose(out, 2 * a.ravel())
    if read_again:
        np.testing.assert_allclose(again, 6 * a)


def test_a_transient_computed_from_the_array_it_is_copied_into_stays_apart():
    # out = reversed(out) * 2 through the transient: written in place, the map would read what it already wrote
    sdfg = _copied(read="out[31 - 8 * i - j]")
    assert reshape_views.copies_as_views(sdfg) == 0
    out = np.arange(32, dtype=np.float32)
    expected = 2 * out[::-1]
    sdfg(a=np.zeros((4, 8), np.float32), out=out, again=np.zeros((4, 8), np.float32))
    np.testing.assert_allclose(out, expected)


def _permutations(sdfg: dace.SDFG) -> list[str]:
    return [
        str(node.label) for node, _ in sdfg.all_nodes_recursive()
        if "Transpose" in str(node.label) and not isinstance(node, dace.nodes.AccessNode)
    ]


def test_permutations_between_images_in_one_memory_order_become_views():
    # ConvNeXt's blocks permute each image to (N, H, W, C) and back: once channels_last lays the images out, each
    # permutation moves no element, yet copied whole images into arrays of their own (ConvNeXt-T: 100 MB of scratch)
    torch.manual_seed(0)
    session = dcnb.optimize(_ConvNeXtBlock(), torch.randn(2, 3, 64, 64), baselines=(), time_budget=0.0)
    assert all(map(_permutations, session.compiled_sdfgs())), "the naive step's permutations move elements"
    step = session.apply("channels_last")
    assert step.ok and step.check.ok, step.error
    assert {"output", "grad dwconv.weight", "grad norm.weight", "grad scale"} <= set(step.check.errors)
    for sdfg in session.compiled_sdfgs():
        assert _permutations(sdfg) == [], sdfg.name
        assert any(isinstance(d, dace.data.View) and len(d.shape) == 4 for d in sdfg.arrays.values())


def _permuted(strides: tuple[int, int, int]) -> dace.SDFG:
    """out = 2 * (a + 1) permuted to (2, 4, 3) through transients: ``t`` = a + 1, ``u`` its permutation (DaCe's
    expansion of a TensorTranspose: a map of one assignment) with ``strides``."""
    sdfg = dace.SDFG("permuted")
    sdfg.add_array("a", [2, 3, 4], dace.float32)
    sdfg.add_array("out", [2, 4, 3], dace.float32)
    sdfg.add_transient("t", [2, 3, 4], dace.float32)
    sdfg.add_transient("u", [2, 4, 3], dace.float32, strides=strides)
    state = sdfg.add_state()
    t, u = state.add_access("t"), state.add_access("u")
    state.add_mapped_tasklet(
        "plus", {"i": "0:2", "j": "0:3", "k": "0:4"}, {"__in": dace.Memlet("a[i, j, k]")}, "__out = __in + 1",
        {"__out": dace.Memlet("t[i, j, k]")}, external_edges=True, output_nodes={"t": t},
    )
    state.add_mapped_tasklet(
        "permute", {"i": "0:2", "j": "0:3", "k": "0:4"}, {"_inp": dace.Memlet("t[i, j, k]")}, "_out = _inp",
        {"_out": dace.Memlet("u[i, k, j]")}, external_edges=True, input_nodes={"t": t}, output_nodes={"u": u},
    )
    state.add_mapped_tasklet(
        "twice", {"i": "0:2", "k": "0:4", "j": "0:3"}, {"__in": dace.Memlet("u[i, k, j]")}, "__out = 2 * __in",
        {"__out": dace.Memlet("out[i, k, j]")}, external_edges=True, input_nodes={"u": u},
    )
    return sdfg


@pytest.mark.parametrize("strides,views", [((12, 1, 4), 1), ((12, 3, 1), 0)], ids=["one-order", "moved"])
def test_a_permutation_becomes_a_view_only_where_it_moves_no_element(strides, views):
    sdfg = _permuted(strides)
    assert reshape_views.permutations_as_views(sdfg) == views
    assert sum(isinstance(d, dace.data.View) for d in sdfg.arrays.values()) == views
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4).copy()
    out = np.zeros((2, 4, 3), np.float32)
    sdfg(a=a, out=out)
    np.testing.assert_allclose(out, 2 * (a + 1).transpose(0, 2, 1))
