"""fuse_rows' split of a map into its rows around a sequential loop over the last dimension (rows.py)."""

import dace
import numpy as np
from dace.sdfg import nodes

from dcnb._src.actions import rows


def _program() -> dace.SDFG:
    """One 3-D map: an input read by three tasklets, one writing a copy, two adding into a row sum (write-conflict
    resolutions) through the same connector of the map's exit, as DaCe's autodiff adds gradients, and a tasklet
    with no input (a constant written beside them)."""
    sdfg = dace.SDFG("split")
    sdfg.add_array("x", [4, 6, 8], dace.float32)
    sdfg.add_array("y", [4, 6, 8], dace.float32)
    sdfg.add_array("s", [4, 6], dace.float32)
    sdfg.add_array("c", [4, 6, 8], dace.float32)
    state = sdfg.add_state()
    x, y, s, c = (state.add_access(name) for name in "xysc")
    entry, exit_ = state.add_map("m", {"i": "0:4", "j": "0:6", "k": "0:8"})
    double = state.add_tasklet("double", {"a"}, {"b"}, "b = 2 * a")
    total = state.add_tasklet("total", {"a"}, {"b"}, "b = a")
    const = state.add_tasklet("const", set(), {"b"}, "b = 7")
    state.add_memlet_path(x, entry, double, dst_conn="a", memlet=dace.Memlet("x[i, j, k]"))
    state.add_memlet_path(x, entry, total, dst_conn="a", memlet=dace.Memlet("x[i, j, k]"))
    state.add_nedge(entry, const, dace.Memlet())
    state.add_memlet_path(double, exit_, y, src_conn="b", memlet=dace.Memlet("y[i, j, k]"))
    state.add_memlet_path(total, exit_, s, src_conn="b", memlet=dace.Memlet("s[i, j]", wcr="lambda a, b: a + b"))
    again = state.add_tasklet("again", {"a"}, {"b"}, "b = a")
    state.add_memlet_path(x, entry, again, dst_conn="a", memlet=dace.Memlet("x[i, j, k]"))
    (into_s,) = [e.dst_conn for e in state.in_edges(exit_) if e.data.data == "s"]
    state.add_edge(again, "b", exit_, into_s, dace.Memlet("s[i, j]", wcr="lambda a, b: a + b"))
    state.add_memlet_path(const, exit_, c, src_conn="b", memlet=dace.Memlet("c[i, j, k]"))
    return sdfg


def test_a_map_splits_into_rows_around_a_sequential_loop_and_computes_the_same():
    sdfg = _program()
    rows._split_rows(sdfg)
    sdfg.validate()
    state = sdfg.start_state
    outer = next(n for n in state.nodes() if isinstance(n, nodes.MapEntry) and state.entry_node(n) is None)
    inner = [n for n in state.nodes() if isinstance(n, nodes.MapEntry) and state.entry_node(n) is outer]
    assert outer.map.params == ["i", "j"] and outer.map.schedule != dace.ScheduleType.Sequential
    assert len(inner) == 1 and inner[0].map.params == ["k"] and inner[0].map.schedule == dace.ScheduleType.Sequential
    assert {str(e.data.subset) for e in state.in_edges(outer)} == {"0:4, 0:6, 0:8"}
    assert {str(e.data.subset) for e in state.in_edges(inner[0]) if not e.data.is_empty()} == {"i, j, 0:8"}
    x = np.random.default_rng(0).random((4, 6, 8), dtype=np.float32)
    y, c = np.zeros_like(x), np.zeros_like(x)
    s = np.zeros((4, 6), np.float32)
    sdfg(x=x, y=y, s=s, c=c)
    np.testing.assert_allclose(y, 2 * x)
    np.testing.assert_allclose(s, 2 * x.sum(axis=2), rtol=1e-5)
    np.testing.assert_array_equal(c, 7)


def _maps(count: int) -> dace.SDFG:
    """``count`` 3-D maps side by side, each doubling an input of its own into an output of its own."""
    sdfg = dace.SDFG("maps")
    state = sdfg.add_state()
    for k in range(count):
        sdfg.add_array(f"x{k}", [4, 6, 8], dace.float32)
        sdfg.add_array(f"y{k}", [4, 6, 8], dace.float32)
        state.add_mapped_tasklet(
            f"m{k}", {"i": "0:4", "j": "0:6", "k": "0:8"}, {"a": dace.Memlet(f"x{k}[i, j, k]")}, "b = 2 * a",
            {"b": dace.Memlet(f"y{k}[i, j, k]")}, external_edges=True,
        )  # fmt: skip
    return sdfg


def test_the_maps_of_a_state_split_with_as_many_walks_of_its_scopes_however_many_they_are(scope_walks):
    # a split changes the state, and finding the next map's exit after it built the state's scopes again: once per
    # map (27 of fuse_rows' 254 s, profiled, on a 12-layer BERT's backward)
    counts = []
    for count in (2, 6):
        sdfg = _maps(count)
        scope_walks.clear()
        rows._split_rows(sdfg)
        counts.append(len(scope_walks))
        state = sdfg.start_state
        assert sum(isinstance(n, nodes.MapEntry) and state.entry_node(n) is None for n in state.nodes()) == count
    assert counts[0] == counts[1], counts
