"""A transient copied whole into an array of another shape becomes a view of it (passes/reshape_views.py)."""

import dace
import numpy as np
import pytest
import torch

import dcnb
from dcnb._src.passes import reshape_views
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
