"""dcnb's auto_optimize fuses what DaCe's greedy_fuse fuses: its map fusion without walking the graph for every pair
of maps, its subgraph fusion without copying the SDFG for sets of maps that cannot fuse (passes/auto_optimize.py)."""

import dace
import numpy as np
import pytest
from dace.sdfg import nodes
from dace.transformation.dataflow import MapFusionVertical, TrivialMapElimination, map_fusion_helper
from dace.transformation.passes import pattern_matching
from dace.transformation.auto import auto_optimize as dace_auto
from dace.transformation.passes import FullMapFusion
from dace.sdfg.graph import SubgraphView
from dace.transformation.subgraph import CompositeFusion, SubgraphFusion
from dace.transformation.subgraph import helpers as subgraph_helpers

from dcnb._src.passes import auto_optimize

N = 64


def _maps(sdfg: dace.SDFG) -> int:
    return sum(isinstance(n, nodes.MapEntry) for n, _ in sdfg.all_nodes_recursive())


def _fan(count: int) -> dace.SDFG:
    """``count`` maps over the same range, each reading ``a`` and writing an output of its own: all parallel."""
    sdfg = dace.SDFG("fan")
    sdfg.add_array("a", [N], dace.float32)
    state = sdfg.add_state()
    source = state.add_access("a")
    for k in range(count):
        sdfg.add_array(f"b{k}", [N], dace.float32)
        state.add_mapped_tasklet(
            f"m{k}", {"i": f"0:{N}"}, {"x": dace.Memlet("a[i]")}, f"y = x * {k + 2}",
            {"y": dace.Memlet(f"b{k}[i]")}, external_edges=True, input_nodes={"a": source},
        )
    return sdfg


def _chain(count: int) -> dace.SDFG:
    """``count`` maps over the same range, each reading the previous one's output one element further on: none
    parallel to another, none fusable with the next."""
    sdfg = dace.SDFG("chain")
    sdfg.add_array("a0", [N], dace.float32)
    state = sdfg.add_state()
    previous = state.add_access("a0")
    for k in range(1, count + 1):
        sdfg.add_array(f"a{k}", [N], dace.float32)
        out = state.add_access(f"a{k}")
        state.add_mapped_tasklet(
            f"m{k}", {"i": f"0:{N - 1}"}, {"x": dace.Memlet(f"a{k - 1}[i + 1]")}, "y = x + 1",
            {"y": dace.Memlet(f"a{k}[i]")}, external_edges=True,
            input_nodes={f"a{k - 1}": previous}, output_nodes={f"a{k}": out},
        )
        previous = out
    return sdfg


@pytest.mark.parametrize("build", [_fan, _chain])
def test_fuses_what_full_map_fusion_fuses(build):
    ours, theirs = build(6), build(6)
    auto_optimize.fuse_maps(ours)
    FullMapFusion(strict_dataflow=True).apply_pass(theirs, {})
    ours.validate()
    assert _maps(ours) == _maps(theirs)
    assert _maps(ours) == (1 if build is _fan else 6)


def test_maps_that_cannot_be_parallel_are_not_walked(calls):
    walks = calls(map_fusion_helper, "is_node_reachable_from")
    FullMapFusion(strict_dataflow=True, perform_horizontal_map_fusion=False).apply_pass(_chain(20), {})
    vertical = len(walks)
    walks.clear()
    auto_optimize.fuse_maps(_chain(20))
    assert len(walks) == vertical
    # DaCe's horizontal fusion walks every pair of the 20 maps at least once: the cost this avoids
    walks.clear()
    FullMapFusion(strict_dataflow=True).apply_pass(_chain(20), {})
    assert len(walks) >= vertical + 20 * 19 // 2


def _pipelines(count: int, length: int) -> dace.SDFG:
    """``count`` states, each a chain of ``length`` maps over the same range and the same indices: each state fuses
    into one map. A state of ``_chain(20)`` (no pair fusable) before them."""
    sdfg = _chain(20)
    sdfg.add_array("src", [N], dace.float32)
    before = sdfg.start_state
    for s in range(count):
        state = sdfg.add_state_after(before)
        previous = state.add_access("src")
        for k in range(length):
            name = f"p{s}_{k}"
            sdfg.add_array(name, [N], dace.float32, transient=k < length - 1)
            out = state.add_access(name)
            state.add_mapped_tasklet(
                f"q{s}_{k}", {"i": f"0:{N}"}, {"v": dace.Memlet(f"{previous.data}[i]")}, "w = v * 2",
                {"w": dace.Memlet(f"{name}[i]")}, external_edges=True,
                input_nodes={previous.data: previous}, output_nodes={name: out},
            )
            previous = out
        before = state
    return sdfg


def test_vertical_fusion_reaches_full_map_fusions_result_testing_each_match_once_a_round(calls):
    ours, theirs = _pipelines(4, 4), _pipelines(4, 4)
    tests = calls(MapFusionVertical, "can_be_applied")
    FullMapFusion(strict_dataflow=True, perform_horizontal_map_fusion=False).apply_pass(theirs, {})
    by_dace = len(tests)
    tests.clear()
    assert auto_optimize._fuse_maps_vertically(ours) == 12
    ours.validate()
    assert _maps(ours) == _maps(theirs) == 20 + 4
    # each round tests each match once: the chain's 19 refused pairs a round, the 3 fusions of each state in its
    # rounds and one round that fuses nothing; DaCe's matching starts again after each of the 12 fusions and tests
    # the chain's pairs before every one of them
    assert len(tests) <= 2 * 19 + 4 * (3 + 2 + 1)
    assert by_dace >= 12 * 19
    src = np.random.rand(N).astype(np.float32)
    outputs = {f"p{s}_3": np.zeros(N, np.float32) for s in range(4)}
    ours(src=src, **{f"a{k}": np.zeros(N, np.float32) for k in range(21)}, **outputs)
    np.testing.assert_allclose(outputs["p3_3"], 16 * src, rtol=1e-6)


def _trivial_maps_nested(count: int) -> dace.SDFG:
    """``count`` nested SDFGs side by side, each adding 1 to its element of ``a`` through a map over one element."""
    sdfg = dace.SDFG("nested_trivial_maps")
    sdfg.add_array("a", [count], dace.float32)
    sdfg.add_array("b", [count], dace.float32)
    state = sdfg.add_state()
    for k in range(count):
        inner = dace.SDFG(f"inner{k}")
        inner.add_array("x", [count], dace.float32)
        inner.add_array("y", [count], dace.float32)
        inner.add_state().add_mapped_tasklet(
            "one", {"i": "0:1"}, {"v": dace.Memlet(f"x[i + {k}]")}, "w = v + 1", {"w": dace.Memlet(f"y[i + {k}]")},
            external_edges=True,
        )
        node = state.add_nested_sdfg(inner, {"x"}, {"y"})
        state.add_edge(state.add_access("a"), None, node, "x", dace.Memlet(f"a[0:{count}]"))
        state.add_edge(node, "y", state.add_access("b"), None, dace.Memlet(f"b[0:{count}]"))
    return sdfg


def test_a_transformation_within_states_is_applied_state_by_state(calls):
    ours, theirs = _trivial_maps_nested(12), _trivial_maps_nested(12)
    collapsed = calls(pattern_matching, "collapse_multigraph_to_nx")
    assert theirs.apply_transformations_repeated(TrivialMapElimination, validate=False) == 12
    by_dace = len(collapsed)
    collapsed.clear()
    assert auto_optimize.repeated_in_each_state(ours, TrivialMapElimination) == 12
    assert _maps(ours) == _maps(theirs) == 0
    # a state's graph is made once per match and once more; DaCe's matching makes every state's before it again
    assert len(collapsed) <= 13 * 2 + 12
    assert by_dace >= 12 * 13 // 2
    a, b = np.arange(12, dtype=np.float32), np.zeros(12, np.float32)
    ours(a=a, b=b)
    np.testing.assert_allclose(b, a + 1)


def test_dace_prints_no_progress_into_the_cells_output():
    import dcnb  # noqa: F401

    assert dace.Config.get_bool("progress") is False


def _transposed_maps(feedback: bool) -> dace.SDFG:
    """m1 over (i, j) writes t; m2 over (j, i) scales it into b: fusable once m2's parameters are reordered (DaCe's
    MultiExpansion, on a copy of the SDFG). With ``feedback``, m3 reads t and writes c, which m2 reads too: a path
    out of {m1, m2} back into it."""
    sdfg = dace.SDFG("transposed_maps_feedback" if feedback else "transposed_maps")
    for name in ("a", "t", "b", "c"):
        sdfg.add_array(name, [N, 8], dace.float32, transient=name in ("t", "c"))
    state = sdfg.add_state()
    a, t, b = state.add_access("a"), state.add_access("t"), state.add_access("b")
    state.add_mapped_tasklet(
        "m1", {"i": f"0:{N}", "j": "0:8"}, {"x": dace.Memlet("a[i, j]")}, "y = 2 * x", {"y": dace.Memlet("t[i, j]")},
        external_edges=True, input_nodes={"a": a}, output_nodes={"t": t},
    )
    inputs, code, input_nodes = {"x": dace.Memlet("t[i, j]")}, "y = x + 1", {"t": t}
    if feedback:
        c = state.add_access("c")
        state.add_mapped_tasklet(
            "m3", {"i": f"0:{N}", "j": "0:8"}, {"x": dace.Memlet("t[i, j]")}, "y = x * x", {"y": dace.Memlet("c[i, j]")},
            external_edges=True, input_nodes={"t": t}, output_nodes={"c": c},
        )
        inputs["u"], code, input_nodes["c"] = dace.Memlet("c[i, j]"), "y = x + u", c
    state.add_mapped_tasklet(
        "m2", {"j": "0:8", "i": f"0:{N}"}, inputs, code, {"y": dace.Memlet("b[i, j]")},
        external_edges=True, input_nodes=input_nodes, output_nodes={"b": b},
    )
    return sdfg


def test_subgraph_fusion_fuses_what_greedy_fuse_fuses():
    ours, theirs = _transposed_maps(False), _transposed_maps(False)
    auto_optimize._greedy_fuse(ours)
    dace_auto.greedy_fuse(theirs, validate_all=True, device=dace.DeviceType.CPU)
    ours.validate()
    assert _maps(ours) == _maps(theirs) == 1
    a = np.random.rand(N, 8).astype(np.float32)
    b = np.zeros((N, 8), np.float32)
    ours(a=a, b=b)
    np.testing.assert_allclose(b, 2 * a + 1, rtol=1e-6)


def test_sets_of_maps_that_cannot_fuse_are_refused_without_copying_the_sdfg(calls):
    sdfg = _transposed_maps(True)
    state = sdfg.start_state
    entries = [n for n in state.nodes() if isinstance(n, nodes.MapEntry) and n.map.label[:2] in ("m1", "m2")]
    assert len(entries) == 2
    subgraph = subgraph_helpers.subgraph_from_maps(sdfg, state, entries)
    copies = calls(dace.SDFG, "__deepcopy__")
    condition = CompositeFusion()
    assert not condition.can_be_applied(sdfg, subgraph)
    # DaCe expands a copy of the whole SDFG to find that out: the cost this avoids
    assert copies
    copies.clear()
    assert not auto_optimize._fusible(condition)(sdfg, subgraph)
    assert not copies


def _transposed_maps_beside_a_nested_sdfg() -> tuple[dace.SDFG, nodes.NestedSDFG]:
    """``_transposed_maps`` and, in the same state, a nested SDFG scaling ``d`` into ``e``, apart from the maps."""
    sdfg = _transposed_maps(False)
    inner = dace.SDFG("scale")
    inner.add_array("x", [N], dace.float32)
    inner.add_array("y", [N], dace.float32)
    inner.add_state().add_mapped_tasklet(
        "scale", {"k": f"0:{N}"}, {"v": dace.Memlet("x[k]")}, "w = 3 * v", {"w": dace.Memlet("y[k]")},
        external_edges=True,
    )
    sdfg.add_array("d", [N], dace.float32)
    sdfg.add_array("e", [N], dace.float32)
    state = sdfg.start_state
    nested = state.add_nested_sdfg(inner, {"x"}, {"y"})
    state.add_edge(state.add_access("d"), None, nested, "x", dace.Memlet(f"d[0:{N}]"))
    state.add_edge(nested, "y", state.add_access("e"), None, dace.Memlet(f"e[0:{N}]"))
    return sdfg, nested


def test_maps_expanded_to_fuse_are_tested_on_a_copy_sharing_what_the_test_leaves_alone(calls):
    sdfg, nested = _transposed_maps_beside_a_nested_sdfg()
    state = sdfg.start_state
    subgraph = subgraph_helpers.subgraph_from_maps(
        sdfg, state, [n for n in state.nodes() if isinstance(n, nodes.MapEntry)]
    )
    copies = calls(dace.SDFG, "__deepcopy__")
    answer = CompositeFusion().can_be_applied(sdfg, subgraph)
    # DaCe's test copies the SDFG and the one nested beside the maps
    assert len(copies) == 2
    copies.clear()
    assert auto_optimize._fusible(CompositeFusion())(sdfg, subgraph) == answer
    assert len(copies) == 1
    # the shared nested SDFG, which the copy pointed at its own parents, points at its own again
    assert (nested.sdfg.parent_nsdfg_node, nested.sdfg.parent, nested.sdfg.parent_sdfg) == (nested, state, sdfg)
    assert sdfg.cfg_list == [sdfg, nested.sdfg]
    auto_optimize._greedy_fuse(sdfg)
    sdfg.validate()
    a, d = np.random.rand(N, 8).astype(np.float32), np.random.rand(N).astype(np.float32)
    b, e = np.zeros((N, 8), np.float32), np.zeros(N, np.float32)
    sdfg(a=a, b=b, d=d, e=e)
    np.testing.assert_allclose(b, 2 * a + 1, rtol=1e-6)
    np.testing.assert_allclose(e, 3 * d, rtol=1e-6)


def _chain_maps(sdfg: dace.SDFG, *labels: str) -> SubgraphView:
    state = sdfg.start_state
    entries = [n for n in state.nodes() if isinstance(n, nodes.MapEntry) and n.map.label[: -len("_map")] in labels]
    assert len(entries) == len(labels)
    return subgraph_helpers.subgraph_from_maps(sdfg, state, entries)


def _deep(count: int) -> dace.SDFG:
    """``_chain(2)``, then ``count`` tasklets one after the other, each reading the one before's result: a state
    over 2 * ``count`` nodes deep below its two maps."""
    sdfg = _chain(2)
    state = sdfg.start_state
    previous = next(n for n in state.sink_nodes() if n.data == "a2")
    sdfg.add_array("s0", [1], dace.float32, transient=True)
    first = state.add_tasklet("t0", {"x"}, {"y"}, "y = x")
    state.add_edge(previous, None, first, "x", dace.Memlet("a2[0]"))
    previous = state.add_access("s0")
    state.add_edge(first, "y", previous, None, dace.Memlet("s0[0]"))
    for k in range(1, count):
        sdfg.add_array(f"s{k}", [1], dace.float32, transient=k < count - 1)
        tasklet = state.add_tasklet(f"t{k}", {"x"}, {"y"}, "y = x + 1")
        state.add_edge(previous, None, tasklet, "x", dace.Memlet(f"s{k - 1}[0]"))
        previous = state.add_access(f"s{k}")
        state.add_edge(tasklet, "y", previous, None, dace.Memlet(f"s{k}[0]"))
    return sdfg


def test_subgraph_fusion_tests_the_topology_of_deep_states_without_recursion():
    # two maps above a path 1600 nodes deep: DaCe's check_topo_feasibility took a frame per node below them
    # (RecursionError on EfficientNet-B0's auto_optimize)
    with dace.config.set_temporary("compiler", "lineinfo", value="none"):  # each node's caller found: 13 s
        sdfg = _deep(800)
    state = sdfg.start_state
    subgraph = _chain_maps(sdfg, "m1", "m2")
    entries = subgraph_helpers.get_outermost_scope_maps(sdfg, state, subgraph)
    _, between, out = SubgraphFusion.get_adjacent_nodes(sdfg, state, entries)
    assert SubgraphFusion.check_topo_feasibility(sdfg, state, entries, between, out)
    # through DaCe's CompositeFusion, which tests it again on an expanded copy, as auto_optimize's greedy fusion does
    short = _deep(2)
    assert auto_optimize._fusible(CompositeFusion())(sdfg, subgraph) == CompositeFusion().can_be_applied(
        short, _chain_maps(short, "m1", "m2")
    )


def test_a_path_out_of_a_set_of_maps_back_into_it_is_still_found():
    sdfg = _chain(6)
    state = sdfg.start_state
    for labels, feasible in ((("m1", "m2"), True), (("m1", "m3"), False), (("m2", "m5"), False)):
        entries = subgraph_helpers.get_outermost_scope_maps(sdfg, state, _chain_maps(sdfg, *labels))
        _, between, out = SubgraphFusion.get_adjacent_nodes(sdfg, state, entries)
        assert SubgraphFusion.check_topo_feasibility(sdfg, state, entries, between, out) is feasible, labels


def _renamed_onto_an_inner_parameter(horizontal: bool) -> dace.SDFG:
    """A map over (i, j) writing ``t``, and a map over (i, k) whose body is a map over j: fused, k becomes j."""
    sdfg = dace.SDFG("renamed_onto_an_inner_parameter")
    sdfg.add_array("a", [4, 8], dace.float32)
    sdfg.add_array("t", [4, 8], dace.float32, transient=not horizontal)
    sdfg.add_array("b", [4, 8, 3], dace.float32)
    state = sdfg.add_state()
    a, t, b = state.add_access("a"), state.add_access("t"), state.add_access("b")
    state.add_mapped_tasklet(
        "first", {"i": "0:4", "j": "0:8"}, {"x": dace.Memlet("a[i, j]")}, "y = 2 * x", {"y": dace.Memlet("t[i, j]")},
        external_edges=True, input_nodes={"a": a}, output_nodes={"t": t},
    )
    outer_entry, outer_exit = state.add_map("second", {"i": "0:4", "k": "0:8"})
    inner_entry, inner_exit = state.add_map("inner", {"j": "0:3"})
    tasklet = state.add_tasklet("scale", {"x"}, {"y"}, "y = x * (j + 1)")
    read = a if horizontal else t
    state.add_memlet_path(read, outer_entry, inner_entry, tasklet, dst_conn="x", memlet=dace.Memlet(f"{read.data}[i, k]"))
    state.add_memlet_path(tasklet, inner_exit, outer_exit, b, src_conn="y", memlet=dace.Memlet("b[i, k, j]"))
    return sdfg


@pytest.mark.parametrize("horizontal", [False, True], ids=["vertical", "horizontal"])
def test_a_map_fused_into_another_keeps_the_maps_inside_it_apart(horizontal):
    # DaCe renamed k to j over the second map's whole scope, its inner map over j too: it wrote b[i, j, j] only
    # (LeViT's HardSwish fused after a transpose: infinities from the rest of the buffer)
    sdfg = _renamed_onto_an_inner_parameter(horizontal)
    fuse = auto_optimize._fuse_parallel_maps if horizontal else auto_optimize._fuse_maps_vertically
    assert fuse(sdfg) == 1
    a = np.random.default_rng(0).random((4, 8), dtype=np.float32)
    b, t = np.full((4, 8, 3), np.nan, np.float32), np.zeros((4, 8), np.float32)
    sdfg(a=a, b=b, **({"t": t} if horizontal else {}))
    source = a if horizontal else 2 * a
    np.testing.assert_allclose(b, source[:, :, None] * np.arange(1, 4, dtype=np.float32))
