"""Making a step scales with the network: what dcnb does per node of a deep graph does not walk the whole graph (or
the whole Python stack) again each time (issue 36). Each test counts the walks on synthetic graphs of two depths."""

import copy
import inspect

import dace
import networkx
import numpy as np
import pytest
import torch
from dace.properties import CodeBlock
from dace.sdfg import nodes
from dace.sdfg.graph import Graph, NodeNotFoundError, OrderedDiGraph
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion, SDFGState
from dace.transformation import helpers
from dace.transformation.onnx.optimize import expand_onnx_nodes
from dace.transformation.passes.simplify import SimplifyPass
from dace.transformation.passes.symbol_propagation import SymbolPropagation
from torch import nn

from dcnb._src import dace_internals, frontend
from dcnb._src.fixes import registry
from dcnb._src.passes import after_autodiff, broadcast_sums, lifetimes, on_import, simplify
from dcnb._src.passes.top_level import add_top_level_map


def _biases(count: int) -> dace.SDFG:
    """``count`` maps, one after the other, each adding its input's rows into a bias gradient of its own with a
    write-conflict resolution, as autodiff writes a broadcast bias's gradient."""
    sdfg = dace.SDFG("biases")
    state = sdfg.add_state()
    sdfg.add_array("x0", [8, 4], dace.float32)
    previous = state.add_access("x0")
    for k in range(count):
        sdfg.add_array(f"x{k + 1}", [8, 4], dace.float32)
        sdfg.add_array(f"g{k}", [8], dace.float32)
        out, grad = state.add_access(f"x{k + 1}"), state.add_access(f"g{k}")
        state.add_mapped_tasklet(
            f"m{k}", {"i": "0:8", "j": "0:4"}, {"a": dace.Memlet(f"x{k}[i, j]")}, "b = a\ng = a",
            {"b": dace.Memlet(f"x{k + 1}[i, j]"), "g": dace.Memlet(f"g{k}[j]", wcr="lambda x, y: x + y")},
            external_edges=True, input_nodes={f"x{k}": previous}, output_nodes={f"x{k + 1}": out, f"g{k}": grad},
        )
        previous = out
    return sdfg


def _nested_writers(count: int) -> dace.SDFG:
    """``count`` nested SDFGs, one after the other, each also adding into half of a gradient of its own through a
    memlet with a write-conflict resolution (which a nested SDFG ignores: accumulate_nested_gradients reroutes it;
    one writing all of it would write in place)."""
    sdfg = dace.SDFG("nested")
    state = sdfg.add_state()
    sdfg.add_array("x0", [4], dace.float32)
    previous = state.add_access("x0")
    for k in range(count):
        inner = dace.SDFG(f"inner{k}")
        inner.add_array("a", [4], dace.float32)
        inner.add_array("b", [4], dace.float32)
        inner.add_array("g", [4], dace.float32)
        inner.add_state().add_mapped_tasklet(
            "copy", {"i": "0:4"}, {"x": dace.Memlet("a[i]")}, "y = x\nz = x",
            {"y": dace.Memlet("b[i]"), "z": dace.Memlet("g[i]")}, external_edges=True,
        )
        sdfg.add_array(f"x{k + 1}", [4], dace.float32)
        sdfg.add_array(f"g{k}", [8], dace.float32)
        node = state.add_nested_sdfg(inner, {"a"}, {"b", "g"})
        out = state.add_access(f"x{k + 1}")
        state.add_edge(previous, None, node, "a", dace.Memlet(f"x{k}[0:4]"))
        state.add_edge(node, "b", out, None, dace.Memlet(f"x{k + 1}[0:4]"))
        state.add_edge(node, "g", state.add_access(f"g{k}"), None, dace.Memlet(f"g{k}[0:4]", wcr="lambda x, y: x + y"))
        previous = out
    return sdfg


def _walks_per_pass(scope_walks, build, run) -> list[int]:
    counts = []
    for count in (4, 16):
        sdfg = build(count)
        scope_walks.clear()
        assert run(sdfg) == count
        # (the nested SDFGs' own states, one node's each, are walked once per node: linear)
        counts.append(sum(walked is sdfg.start_state for walked in scope_walks))
        sdfg.validate()
    return counts


def test_bias_gradients_are_summed_with_one_walk_of_the_state(scope_walks):
    # gap: add_mapped_tasklet's propagation worked the state's scopes out again for each map it added (and
    # exit_node for each map read): 16 s of ResNet-50's autodiff phase
    few, many = _walks_per_pass(scope_walks, _biases, broadcast_sums.sums_without_atomics)
    assert few == many <= 2


def test_nested_gradients_are_rerouted_with_one_walk_of_the_state(scope_walks):
    # the same for each write of a nested SDFG rerouted (entry_node for each node read): 20 s of ResNet-50's
    few, many = _walks_per_pass(scope_walks, _nested_writers, after_autodiff.accumulate_nested_gradients)
    assert few == many <= 1


def test_a_sums_reduction_type_is_worked_out_once(calls):
    # DaCe's detect_reduction_type evaluates the lambda with sympy: once per write-conflict resolution read
    found = calls(broadcast_sums, "detect_reduction_type")
    broadcast_sums._reduction_type.cache_clear()
    assert broadcast_sums.sums_without_atomics(_biases(16)) == 16
    assert len(found) == 1


@pytest.mark.parametrize(
    "inputs, outputs",
    [
        ({"a": "x[i, j]"}, {"b": "y[i, j]"}),
        ({"a": "x[i, 2 * j + 1]"}, {"b": "s[i]"}),  # a sum: the write-conflict resolution kept outside
        ({"a": "x[i, j]", "c": "x[i, j + 1]"}, {"b": "y[3, i]"}),  # two reads of one array, unioned
        ({"a": "x[i, j]", "c": "x[i, j]"}, {"b": "y[i + 1, 2]"}),  # two equal reads, counted once
        ({}, {"b": "y[i, j]"}),  # nothing read (a zeroing)
    ],
)
def test_a_top_level_map_gets_the_outer_memlets_dace_propagates(inputs, outputs):
    made = []
    for add in (_dace_s, add_top_level_map):
        sdfg = dace.SDFG("top")
        sdfg.add_array("x", [8, 9], dace.float32)
        sdfg.add_array("y", [8, 8], dace.float32)
        sdfg.add_array("s", [8], dace.float32)
        state = sdfg.add_state()
        reads = {m.split("[")[0] for m in inputs.values()}
        writes = {m.split("[")[0] for m in outputs.values()}
        add(
            state, "m", {"i": "0:4", "j": "0:4"},
            {c: dace.Memlet(m) for c, m in inputs.items()}, "b = a" if inputs else "b = 0",
            {c: dace.Memlet(m, wcr="lambda x, y: x + y" if m.startswith("s") else None) for c, m in outputs.items()},
            {d: state.add_access(d) for d in sorted(reads)}, {d: state.add_access(d) for d in sorted(writes)},
        )
        sdfg.validate()
        made.append(
            sorted(
                (str(e.src), str(e.dst), e.data.data, str(e.data.subset), str(e.data.volume), e.data.dynamic,
                 e.data.wcr, e.data._is_data_src, e.data._edge is e)
                for e in state.edges()
            )
        )
    assert made[0] == made[1]


def _zeroed(count: int) -> dace.SDFG:
    """``count`` transients that start at zero (``setzero``), each a tasklet adds into and an output copies."""
    sdfg = dace.SDFG("zeroed")
    state = sdfg.add_state()
    for k in range(count):
        sdfg.add_array(f"t{k}", [4, 3], dace.float32, transient=True)
        sdfg.add_array(f"o{k}", [4, 3], dace.float32)
        tasklet = state.add_tasklet(f"add{k}", {}, {"y"}, "y = 1")
        zeroed = state.add_access(f"t{k}")
        zeroed.setzero = True
        state.add_edge(tasklet, "y", zeroed, None, dace.Memlet(f"t{k}[0, 0]", wcr="lambda x, y: x + y"))
        state.add_nedge(zeroed, state.add_access(f"o{k}"), dace.Memlet(f"t{k}[0:4, 0:3]"))
    return sdfg


def test_transients_are_zeroed_without_resolving_every_array_s_symbols_per_array(calls):
    # gap: add_mapped_tasklet's propagation resolved the symbols of every array of the SDFG for each zeroing map
    # scratch_once_per_binary added (6 s of EfficientNet-B0's backward build)
    resolved = calls(dace.SDFGState, "sdfg_symbols")
    sdfg = _zeroed(8)
    assert lifetimes.scratch_once_per_binary(sdfg) == 8
    sdfg.validate()
    zeroing = [n for n in sdfg.start_state.nodes() if isinstance(n, dace.nodes.Tasklet) and n.label.startswith("zero_")]
    assert len(zeroing) == 8 and not resolved


def _dace_s(state, name, ranges, inputs, code, outputs, input_nodes, output_nodes):
    return state.add_mapped_tasklet(
        name, ranges, inputs, code, outputs, external_edges=True, input_nodes=input_nodes, output_nodes=output_nodes
    )


def _line() -> int:
    return inspect.currentframe().f_back.f_lineno


def test_a_node_added_records_its_caller_s_line_without_walking_the_stack(calls):
    # gap: DaCe's default line information (compiler.lineinfo "inspect") took inspect.stack() per node added
    stacks = calls(inspect, "stack")
    with dace.config.set_temporary("compiler", "lineinfo", value="inspect"):
        sdfg = dace.SDFG("lines")
        sdfg.add_array("x", [4], dace.float32)
        state = sdfg.add_state()
        node, line = state.add_access("x"), _line()
        _, entry, _ = state.add_mapped_tasklet(
            "m", {"i": "0:4"}, {"a": dace.Memlet("x[i]")}, "b = a", {"b": dace.Memlet("x[i]")}, external_edges=True
        )
    assert not stacks
    assert (node.debuginfo.start_line, node.debuginfo.filename) == (line, __file__)
    assert entry.map.debuginfo.start_line == line + 1
    explicit = dace.dtypes.DebugInfo(7, 0, 7, 0, "given.py")
    assert state.add_access("x", debuginfo=explicit).debuginfo is explicit
    with dace.config.set_temporary("compiler", "lineinfo", value="none"):
        assert state.add_access("x", debuginfo=explicit).debuginfo is None


def test_a_transformed_sdfg_carries_no_copy_of_itself(calls):
    # gap: DaCe's transformation history deep-copied the whole SDFG at its first transformation (orig_sdfg), a copy
    # every later deepcopy and serialization of it made again
    sdfg = dace.SDFG("history")
    sdfg.add_array("x", [4, 8], dace.float32)
    sdfg.add_array("y", [8], dace.float32)
    state = sdfg.add_state()
    state.add_reduce("lambda a, b: a + b", [0], 0)
    reduce = state.nodes()[-1]
    state.add_edge(state.add_read("x"), None, reduce, None, dace.Memlet("x[0:4, 0:8]"))
    state.add_edge(reduce, None, state.add_write("y"), None, dace.Memlet("y[0:8]"))
    copies = calls(dace.SDFG, "__deepcopy__")
    reduce.expand(state)
    # (the expansion's own SDFG is nested into this one, not copied)
    assert sdfg.orig_sdfg is None and not sdfg.transformation_hist and not copies


def _comb(count: int, cycle: str = "") -> dace.SDFGState:
    """A chain of ``count`` tasklets, each also reading a weight of its own (``count`` source nodes, as a network's
    parameters are); ``cycle`` "reached" closes a loop below the chain's start, "apart" one no source reaches."""
    sdfg = dace.SDFG("comb")
    state = sdfg.add_state()
    sdfg.add_array("x", [1], dace.float32)
    previous = state.add_access("x")
    chain = []
    for k in range(count):
        sdfg.add_array(f"w{k}", [1], dace.float32)
        sdfg.add_array(f"a{k}", [1], dace.float32)
        tasklet = state.add_tasklet(f"t{k}", {"x", "w"}, {"y"}, "y = x * w")
        state.add_edge(previous, None, tasklet, "x", dace.Memlet(f"{previous.data}[0]"))
        state.add_edge(state.add_access(f"w{k}"), None, tasklet, "w", dace.Memlet(f"w{k}[0]"))
        previous = state.add_access(f"a{k}")
        state.add_edge(tasklet, "y", previous, None, dace.Memlet(f"a{k}[0]"))
        chain.append(previous)
    if cycle == "reached":
        state.add_nedge(chain[-1], chain[1], dace.Memlet())
    if cycle == "apart":
        sdfg.add_array("p", [1], dace.float32)
        sdfg.add_array("q", [1], dace.float32)
        p, q = state.add_access("p"), state.add_access("q")
        state.add_nedge(p, q, dace.Memlet())
        state.add_nedge(q, p, dace.Memlet())
    return state


@pytest.mark.parametrize("cycle", ["", "reached", "apart"])
def test_a_state_is_checked_for_cycles_with_dace_s_answer(cycle):
    state = _comb(6, cycle)
    assert state.has_cycles() == dace_internals.has_cycles.dace(state) == (cycle == "reached")
    # a graph without source nodes: a cycle anywhere counts
    ring = _comb(0, "apart")
    ring.remove_node(next(n for n in ring.nodes() if n.data == "x"))
    assert ring.has_cycles() and dace_internals.has_cycles.dace(ring)
    assert not dace.SDFG("empty").add_state().has_cycles()


def test_a_state_with_many_sources_is_checked_for_cycles_in_one_walk(monkeypatch):
    # gap: networkx's find_cycle, started from each source node, walked everything below each one again
    walked = []
    edge_dfs = networkx.edge_dfs

    def counted(*args, **kwargs):
        for edge in edge_dfs(*args, **kwargs):
            walked.append(edge)
            yield edge

    monkeypatch.setattr(networkx, "edge_dfs", counted)
    state = _comb(40)
    follows = []
    out_edges = state.out_edges
    monkeypatch.setattr(state, "out_edges", lambda node: follows.append(node) or out_edges(node))
    assert not state.has_cycles()
    assert len(walked) + len(follows) <= 2 * state.number_of_nodes()


def test_a_state_s_sinks_and_node_indices_are_dace_s_after_every_change():
    state = _comb(3)
    dace_sinks = lambda: Graph.sink_nodes(state)  # noqa: E731
    dace_ids = lambda: [OrderedDiGraph.node_id(state, n) for n in state.nodes()]  # noqa: E731
    checks = 0

    def same():
        nonlocal checks
        checks += 1
        assert state.sink_nodes() == dace_sinks() and [state.node_id(n) for n in state.nodes()] == dace_ids()

    same()
    extra = state.add_access("w0")
    same()
    edge = state.add_nedge(state.sink_nodes()[0], extra, dace.Memlet())
    same()
    state.remove_edge(edge)
    same()
    state.remove_node(state.nodes()[0])
    same()
    state.reverse()
    same()
    state.reverse()
    copied = copy.deepcopy(state.sdfg).start_state
    assert [n.label for n in copied.sink_nodes()] == [n.label for n in state.sink_nodes()]
    with pytest.raises(NodeNotFoundError):
        state.node_id(nodes.AccessNode("w1"))
    assert checks == 6


def test_a_state_s_sinks_and_node_indices_are_found_with_one_walk_while_it_does_not_change(calls):
    # gap: code generation listed a state's sink nodes per access node and walked its nodes for a node's index per
    # line of code written (30 of the 110 s generating EfficientNet-B0's backward took)
    state = _comb(40)
    sinks, ids = calls(Graph, "sink_nodes"), calls(OrderedDiGraph, "node_id")
    for i, node in enumerate(state.nodes()):
        assert state.node_id(node) == i
        state.sink_nodes()
    assert len(sinks) <= 1 and not ids


@dace.program
def _nested_maps(a: dace.float32[16, 8], b: dace.float32[16, 8], c: dace.float32[16, 8]):
    for i in dace.map[0:16]:
        t = np.ndarray([8], dace.float32)
        for j in dace.map[0:8]:
            t[j] = a[i, j] * 2
        for j in dace.map[0:8]:
            b[i, j] = t[j] + 1
    for i, j in dace.map[0:16, 0:8]:
        c[i, j] = b[i, j] * b[i, j]


def test_a_state_s_scope_children_are_dace_s_from_one_walk_after_every_change(scope_walks):
    # gap: DaCe walked the whole state again for its scopes' children, after the walk for its scope dictionary: every
    # map fusion of auto_optimize then made the next test walk a 12-layer BERT's backward twice
    state = _nested_maps.to_sdfg(simplify=True).start_state
    dace_children = SDFGState.scope_children.dace
    for change in (lambda: state.add_access("a"), lambda: state.remove_node(state.sink_nodes()[0])):
        change()
        scope_walks.clear()
        assert state.scope_dict() and state.scope_children() == state.scope_children()
        assert len(scope_walks) == 1
        assert state.scope_children() == dace_children(state)
        assert list(state.scope_children()) == list(dace_children(state))
        assert state.scope_children(return_ids=True) == dace_children(state, True)
    assert len(state.scope_children()) == 1 + 4  # the top level and the four maps


class _Layers(nn.Module):
    """Layers whose ops the import expands (Softmax, Erf: no backward rule of DaCe's), each into a nested SDFG of
    one state."""

    def __init__(self, count: int):
        super().__init__()
        self.count = count

    def forward(self, x):
        for _ in range(self.count):
            x = torch.softmax(torch.erf(x), dim=-1)
        return x


@pytest.fixture
def isolations(monkeypatch):
    """Each call of DaCe's ``isolate_nested_sdfg`` (the multi-state inliner's split of the state around a nested
    SDFG, or its test whether it could): whether it was only a test."""
    isolated, original = [], helpers.isolate_nested_sdfg

    def counted(state, *args, **kwargs):
        isolated.append(kwargs.get("test_if_applicable", False))
        return original(state, *args, **kwargs)

    monkeypatch.setattr(helpers, "isolate_nested_sdfg", counted)
    return isolated


@pytest.mark.parametrize("count", [2, 6])
def test_the_ops_expanded_at_import_are_inlined_without_splitting_the_state_around_each(isolations, count):
    # DaCe's simplify inlined each of a 12-layer BERT's 312 expanded ops with its multi-state inliner, which splits
    # the state around it in three, a walk of the whole state each (29.5 of the import's 50 s under load)
    imported = frontend.import_module(_Layers(count), (torch.rand(2, 8),), training=False)
    isolations.clear()  # the import's own, before the lowering looked at here
    expanded = copy.deepcopy(imported.sdfg)
    on_import.lower(expanded)
    assert not [n for n, _ in expanded.all_nodes_recursive() if isinstance(n, nodes.NestedSDFG)]
    assert len(expanded.nodes()) == 1 and [a for a in isolations if not a] == [], isolations


def test_every_simplify_of_dcnb_s_inlines_nested_sdfgs_of_one_state_without_splitting_the_state(isolations):
    # an action's expansions are inlined by simplify as the import's are (fuse_rows' on a 12-layer BERT's backward:
    # 1,320 nested SDFGs of one state)
    imported = frontend.import_module(_Layers(4), (torch.rand(2, 8),), training=False)
    expanded = copy.deepcopy(imported.sdfg)
    expand_onnx_nodes(expanded)
    assert [n for n, _ in expanded.all_nodes_recursive() if isinstance(n, nodes.NestedSDFG)]
    isolations.clear()  # the import's and the expansion's own, before the simplify looked at here
    simplify.simplify(expanded)
    assert not [n for n, _ in expanded.all_nodes_recursive() if isinstance(n, nodes.NestedSDFG)]
    assert len(expanded.nodes()) == 1 and [a for a in isolations if not a] == [], isolations


def _assigned(value: str | None) -> dace.SDFG:
    """Two states; the edge between them assigns ``n = value`` (None: assigns nothing), and the second copies
    ``n`` into an output."""
    sdfg = dace.SDFG("assigned")
    sdfg.add_array("out", [1], dace.int64)
    sdfg.add_symbol("n", dace.int64)
    first, second = sdfg.add_state("first"), sdfg.add_state("second")
    sdfg.add_edge(first, second, dace.InterstateEdge(assignments={"n": value} if value else {}))
    tasklet = second.add_tasklet("put", {}, {"o"}, "o = n")
    second.add_edge(tasklet, "o", second.add_write("out"), None, dace.Memlet("out[0]"))
    return sdfg


def test_symbol_propagation_skips_an_sdfg_that_assigns_no_symbol_and_propagates_where_one_is(calls):
    # DaCe's SymbolPropagation works out the whole SDFG's free symbols before and after, to check itself, where it
    # can propagate nothing (40 of fuse_rows' 290 s, profiled, on a 12-layer BERT's backward)
    replaced = [type(p) for p in SimplifyPass().passes if isinstance(p, SymbolPropagation)]
    assert replaced and replaced[0] is not SymbolPropagation
    walks = calls(dace.SDFG, "free_symbols")
    unassigned = _assigned(None)
    assert replaced[0]().apply_pass(unassigned, {}) is None and walks == []
    assert SymbolPropagation().apply_pass(_assigned(None), {}) is None and walks  # DaCe's walks it
    assigned = _assigned("5")
    assert replaced[0]().apply_pass(assigned, {}) == {"n"}
    assert "n" not in assigned.free_symbols


def test_the_nested_sdfgs_simplify_inlines_rebuild_the_region_list_once(monkeypatch):
    # gap: DaCe's InlineSDFG rebuilds the list of the tree's control-flow regions after each inline, a walk of the
    # whole tree each (7.5 of auto_optimize's 142 s on a 12-layer BERT's backward)
    imported = frontend.import_module(_Layers(4), (torch.rand(2, 8),), training=False)
    expanded = copy.deepcopy(imported.sdfg)
    expand_onnx_nodes(expanded)
    walks, original = [], dace.sdfg.state.AbstractControlFlowRegion.all_control_flow_regions

    def counted(region, *args, **kwargs):
        if region is expanded:
            walks.append(1)
        return original(region, *args, **kwargs)

    monkeypatch.setattr(dace.sdfg.state.AbstractControlFlowRegion, "all_control_flow_regions", counted)
    assert simplify.inline_single_states(expanded) >= 4
    assert len(walks) == 1
    assert "reset_cfg_list" not in expanded.__dict__
    regions = list(original(expanded, recursive=True))
    assert expanded.cfg_list == regions and [r.cfg_id for r in regions] == list(range(len(regions)))
    expanded.validate()


def _nested(symbol: str | None) -> dace.SDFG:
    """A nested SDFG copying ``a`` into ``b``, of ``symbol`` elements (None: of 4, without symbols)."""
    nested = dace.SDFG("nested")
    size = symbol or 4
    nested.add_array("a", [size], dace.float32)
    nested.add_array("b", [size], dace.float32)
    state = nested.add_state()
    state.add_nedge(state.add_read("a"), state.add_write("b"), dace.Memlet(f"a[0:{size}]"))
    if symbol:
        del nested.symbols[symbol]  # as a frontend leaves it: used, but not declared
    return nested


@pytest.mark.parametrize("symbol", [None, "n"])
def test_a_nested_sdfg_is_added_without_looking_up_its_parent_s_symbols_where_it_declares_all_it_maps(symbol, calls):
    # gap: DaCe worked out every symbol the parent defines (a walk of all its arrays) per nested SDFG added, to type
    # the symbols the nested SDFG lacks (8.5 of auto_optimize's 142 s on a 12-layer BERT's backward), and the nested
    # SDFG's free symbols twice
    parent = dace.SDFG("parent")
    parent.add_symbol("n", dace.int32)
    for name in "xy":
        parent.add_array(name, [symbol or 4], dace.float32)
    state = parent.add_state()
    lookups = calls(dace.SDFGState, "defined_symbols")
    nested = _nested(symbol)
    walks = calls(dace_internals, "_accessed")  # once per walk of the nested SDFG for its free symbols
    node = state.add_nested_sdfg(nested, {"a"}, {"b"})
    assert len(walks) == 1 and nested.free_symbols == ({"n"} if symbol else set())
    assert "defined_symbols" not in state.__dict__ and "used_symbols" not in nested.__dict__
    if symbol is None:
        assert not lookups and node.symbol_mapping == {}
    else:  # typed as the parent types it, as DaCe does
        assert len(lookups) == 1 and nested.symbols["n"] == dace.int32 and str(node.symbol_mapping["n"]) == "n"


def _accessing() -> dace.SDFG:
    """An SDFG reaching its arrays each way DaCe's read and write sets count them (a map, a copy in a branch, an
    interstate condition, a branch's condition), and two of them not at all (an edge carrying no data, none)."""
    sdfg = dace.SDFG("accessing")
    for name, size in (("x", "n"), ("z", "n"), ("flag", "f"), ("c", "p"), ("y", "m"), ("w", "q"), ("v", "r")):
        sdfg.add_array(name, [size], dace.float32)
    first = sdfg.add_state("first")
    first.add_mapped_tasklet(
        "copy", {"i": "0:n"}, {"a": dace.Memlet("x[i]")}, "b = a", {"b": dace.Memlet("z[i]")}, external_edges=True
    )
    first.add_edge(first.add_access("w"), None, first.add_tasklet("waits", {}, {}, ""), None, dace.Memlet())
    second = sdfg.add_state("second")
    sdfg.add_edge(first, second, dace.InterstateEdge("flag[0] > 0"))
    branch = ConditionalBlock("branch")
    sdfg.add_node(branch)
    sdfg.add_edge(second, branch, dace.InterstateEdge())
    then = ControlFlowRegion("then", sdfg=sdfg)
    branch.add_branch(CodeBlock("c[0] > 0"), then)
    inside = then.add_state("inside", is_start_block=True)
    inside.add_edge(inside.add_read("x"), None, inside.add_write("v"), None, dace.Memlet("x[0:1]"))
    return sdfg


def test_an_sdfg_s_free_symbols_take_the_arrays_it_accesses_by_name_with_dace_s_answer(calls, monkeypatch):
    # gap: the free symbols took only the names of DaCe's read and write sets, which work out every subset and each
    # state's concurrent subgraphs (17 of the 109 s profiled of generating a 12-layer BERT's backward's code)
    sdfg = _accessing()
    sdfg.validate()
    walks = calls(dace.SDFG, "read_and_write_sets")
    assert dace_internals._accessed(sdfg) == {"c", "flag", "v", "x", "z"}
    asked = [{"all_symbols": True}, {"all_symbols": False}, {"all_symbols": False, "keep_defined_in_mapping": True}]
    found = [sdfg.used_symbols(**options) for options in asked] + [list(sdfg.arglist())]
    assert not walks
    assert set().union(*dace.SDFG.read_and_write_sets(sdfg)) == {"c", "flag", "v", "x", "z"}
    monkeypatch.setattr(dace.SDFG, "_used_symbols_internal", dace.SDFG._used_symbols_internal.__wrapped__)
    assert found == [sdfg.used_symbols(**options) for options in asked] + [list(sdfg.arglist())]


def _sums(gpu_map: bool) -> tuple[dace.SDFGState, nodes.LibraryNode, nodes.LibraryNode | None]:
    """A state summing ``x`` into ``y``, and (``gpu_map``) another sum inside a map of a GPU schedule."""
    sdfg = dace.SDFG("sums")
    sdfg.add_array("x", [4, 8], dace.float32)
    sdfg.add_array("y", [8], dace.float32)
    state = sdfg.add_state()
    outside = state.add_reduce("lambda a, b: a + b", [0], 0)
    state.add_edge(state.add_read("x"), None, outside, None, dace.Memlet("x[0:4, 0:8]"))
    state.add_edge(outside, None, state.add_write("y"), None, dace.Memlet("y[0:8]"))
    if not gpu_map:
        return state, outside, None
    entry, exit_ = state.add_map("kernel", {"i": "0:1"}, schedule=dace.ScheduleType.GPU_Device)
    inside = state.add_reduce("lambda a, b: a + b", [0], 0)
    state.add_memlet_path(state.add_read("x"), entry, inside, memlet=dace.Memlet("x[0:4, 0:8]"))
    state.add_memlet_path(inside, exit_, state.add_write("y"), memlet=dace.Memlet("y[0:8]"))
    return state, outside, inside


def test_a_library_node_is_placed_without_the_state_s_scopes_where_no_gpu_scope_is_around(calls):
    # gap: DaCe's is_devicelevel_gpu reads the state's scope dictionary, which each expansion discards: a walk of the
    # whole state per library node picked (19 of auto_optimize's 310 s, profiled, on a 12-layer BERT's backward)
    state, outside, _ = _sums(gpu_map=False)
    scopes = calls(dace.SDFGState, "scope_dict")
    assert registry.on_cpu(outside, state, state.sdfg) and not registry.on_gpu_host(outside, state, state.sdfg)
    assert not scopes
    state, outside, inside = _sums(gpu_map=True)  # DaCe's answer where a GPU scope is around
    assert registry.on_cpu(outside, state, state.sdfg) and not registry.on_cpu(inside, state, state.sdfg)
    assert scopes


class _Clamps(nn.Module):
    def forward(self, x):
        return torch.clamp(x, -1, 1) * torch.clamp(x, -2, 2) + torch.sin(x) * torch.cos(x)


def test_only_nodes_alike_in_all_an_expansion_reads_but_names_share_an_expansion():
    # Clip's expansion reads its bounds from the ONNX model's constants, outside the SDFG: each expands anew
    imported = frontend.import_module(_Clamps(), (torch.rand(2, 8),), training=False)
    state = imported.sdfg.start_state
    keys = {}
    for node in state.nodes():
        if isinstance(node, nodes.LibraryNode):
            key = dace_internals._expansion_key(type(node), node, state, state.sdfg)
            keys.setdefault(node.schema.name, []).append(key)
    assert keys["Clip"] == [None, None]
    first, second = keys["Mul"]  # of Clip's results, and of Sin's and Cos's: arrays alike, named apart
    assert first is not None and first == second
    assert keys["Add"][0] not in (None, first)


def test_an_sdfg_s_array_symbols_are_worked_out_again_only_for_an_array_whose_shape_changed(calls):
    # gap: DaCe worked out every array's symbols for every symbol lookup, a walk of all the SDFG's arrays each (10.6
    # of auto_optimize's 142 s on a 12-layer BERT's backward)
    sdfg = dace.SDFG("symbols")
    sdfg.add_symbol("n", dace.int32)
    sdfg.add_array("a", ["n", 4], dace.float32)
    sdfg.add_array("b", [8], dace.float32)
    sdfg.add_scalar("c", dace.float64)
    state = sdfg.add_state()
    assert state.sdfg_symbols() == {"n": dace.int32}
    walks = calls(dace.data.Array, "free_symbols")
    assert state.sdfg_symbols() == {"n": dace.int32} and not walks
    sdfg.arrays["b"].set_shape([dace.symbol("k", dace.int16)])
    assert state.sdfg_symbols() == {"n": dace.int32, "k": dace.int16} and len(walks) == 1
    sdfg.arrays["a"].strides = [dace.symbol("s", dace.int64), 1]
    assert state.sdfg_symbols() == {"n": dace.int32, "s": dace.int64, "k": dace.int16} and len(walks) == 2


def test_an_sdfg_s_kept_array_symbols_are_checked_without_reading_the_arrays_properties(monkeypatch):
    # DaCe's properties are Python descriptors: reading an array's four parts through them to check the kept symbols
    # took 4 of the 7 s that 4,752 walks of 1,100 arrays took in auto_optimize on a 12-layer BERT's backward
    sdfg = dace.SDFG("symbols")
    sdfg.add_symbol("n", dace.int32)
    for name in "abcd":
        sdfg.add_array(name, ["n", 4], dace.float32)
    state = sdfg.add_state()
    assert state.sdfg_symbols() == {"n": dace.int32}
    reads, original = [], dace.properties.Property.__get__

    def counted(prop, obj, objtype=None):
        if isinstance(obj, dace.data.Data):
            reads.append(prop.attr_name)
        return original(prop, obj, objtype)

    monkeypatch.setattr(dace.properties.Property, "__get__", counted)
    assert state.sdfg_symbols() == {"n": dace.int32} and not reads
    sdfg.arrays["c"].set_shape([dace.symbol("k", dace.int16)])
    assert state.sdfg_symbols() == {"n": dace.int32, "k": dace.int16}


def test_a_nested_sdfg_added_two_levels_down_is_listed_without_comparing_regions(monkeypatch):
    # gap: DaCe's update_cfg_list scans the tree's region list for each region it adds; two levels down the list it
    # adds is the root's own, every region compared with those before it (6.1 of the 49 s that generating a 12-layer
    # BERT's backward takes)
    root = dace.SDFG("root")
    state = root.add_state()
    for _ in range(20):
        middle = _nested(None)
        state.add_nested_sdfg(middle, {"a"}, {"b"})
    compared = []
    monkeypatch.setattr(
        dace.sdfg.state.ControlFlowBlock, "__eq__", lambda block, other: compared.append(1) or block is other
    )
    innermost = _nested(None)
    middle.start_block.add_nested_sdfg(innermost, {"a"}, {"b"})
    assert not compared
    regions = list(root.all_control_flow_regions(recursive=True))
    assert root.cfg_list == regions and len({id(r) for r in root.cfg_list}) == len(regions) == 22
    assert all(r.cfg_list is root.cfg_list for r in regions) and innermost.cfg_id == 21


def _reductions(count: int) -> dace.SDFG:
    """``count`` row sums, one after the other, each of the previous one's result broadcast back by a map."""
    sdfg = dace.SDFG("reductions")
    state = sdfg.add_state()
    sdfg.add_array("x0", [4, 8], dace.float32)
    previous = state.add_access("x0")
    for k in range(count):
        sdfg.add_array(f"s{k}", [8], dace.float32)
        sdfg.add_array(f"x{k + 1}", [4, 8], dace.float32)
        total = state.add_reduce("lambda a, b: a + b", [0], 0)
        state.add_edge(previous, None, total, None, dace.Memlet(f"x{k}[0:4, 0:8]"))
        sums = state.add_access(f"s{k}")
        state.add_edge(total, None, sums, None, dace.Memlet(f"s{k}[0:8]"))
        previous = state.add_access(f"x{k + 1}")
        state.add_mapped_tasklet(
            f"spread{k}", {"i": "0:4", "j": "0:8"}, {"a": dace.Memlet(f"s{k}[j]")}, "b = a",
            {"b": dace.Memlet(f"x{k + 1}[i, j]")}, external_edges=True,
            input_nodes={f"s{k}": sums}, output_nodes={f"x{k + 1}": previous},
        )
    return sdfg


def test_library_nodes_expand_into_nested_sdfgs_with_one_walk_of_their_state_s_scopes(scope_walks):
    # gap: an expansion discards the state's scopes and the nested SDFG's integration works them out again, a walk
    # of the whole state per library node (180 walks of a 1,300-node state generating a 12-layer BERT's forward)
    def expand(sdfg: dace.SDFG) -> int:
        sdfg.start_state.scope_dict()
        sdfg.expand_library_nodes()
        return sum(isinstance(n, nodes.NestedSDFG) for n in sdfg.start_state.nodes())

    few, many = _walks_per_pass(scope_walks, _reductions, expand)
    assert few == many <= 2  # as many walks for 16 library nodes as for 4


def test_the_nested_sdfgs_of_a_state_are_checked_for_inlining_with_one_walk_of_its_scopes(scope_walks):
    # gap: each inline discards the state's scopes, and InlineSDFG's check of the next nested SDFG (entry_node, the
    # symbols defined at it) worked them all out again: 6.6 of the import's 35 s profiled on a 12-layer BERT
    walks = []
    for count in (2, 6):
        imported = frontend.import_module(_Layers(count), (torch.rand(2, 8),), training=False)
        expanded = copy.deepcopy(imported.sdfg)
        expand_onnx_nodes(expanded)
        state = expanded.start_state
        scope_walks.clear()
        assert simplify.inline_single_states(expanded) >= 2 * count
        walks.append(scope_walks.count(state))
        expanded.validate()
    assert walks[0] == walks[1] <= 1, walks
