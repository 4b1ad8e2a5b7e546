"""fuse_rows: softmax- and normalization-like code as one parallel map over rows, as a hand-written kernel has it.

DaCe expands ONNX Softmax, LayerNormalization and their backward passes into a chain of maps over whole tensors
with reductions in between, and by default a reduction is a map over all elements adding into its output with
atomics. This action, after autodiff, on the forward and the backward:

1. expands library nodes, reductions without atomics: along rows and down columns as fixes/reduce_node.py has them,
   others as a map over the kept dimensions with a sequential loop over the reduced ones (DaCe's "pure-seq");
2. splits every map of several dimensions into a map over all but the last (the rows) around a sequential map
   over the last, except maps over exactly the rows;
3. fuses the row maps (MapFusion of the outermost maps): what one row needs (its maximum, its sum, its
   exponentials) then stays in cache or on the stack, and each row is read from memory once or twice instead of
   once per operation;
4. folds the column sums of what the row map writes or reads (a norm's weight and bias gradients) into it, as
   partial sums per chunk of rows (partial_sums.py), instead of writing a full-size temporary to sum afterwards;
5. fuses the loops inside a row, a sum into the loop computing its terms, into as few passes over the row as the
   reductions allow (LayerNorm's backward: 17 passes over each row -> 7, 4.3 -> 2.9 ms);
6. puts small constant-size transients on the stack (DaCe's move_small_arrays_to_stack, with a 4096-element
   limit), so that per-row buffers are not heap allocations in the loop.

The same is done inside each op's nested SDFG left at the top level (one that simplify did not inline).

On a GPU a row per thread reads memory no warp can coalesce; ``to_warps`` gives each row a warp instead. It is
built for sm_90 without a GPU (tests/compile/test_rows_cuda.py), not yet run on one, and so not offered as a step.
"""

from __future__ import annotations

import copy
import warnings
from collections import defaultdict

import dace
from dace import subsets
from dace.config import Config, temporary_config
from dace.libraries.standard import Reduce
from dace.memlet import Memlet
from dace.sdfg import nodes
from dace.sdfg.graph import SubgraphView
from dace.sdfg.propagation import propagate_memlets_scope
from dace.transformation import helpers as xfh
from dace.transformation.auto.auto_optimize import move_small_arrays_to_stack
from dace.transformation.dataflow import MapCollapse, MapFusionVertical, WarpTiling
from dace.transformation.onnx.optimize import expand_onnx_nodes
from dace.transformation.optimizer import Optimizer

from .. import dace_internals
from ..fixes import reduce_node
from ..passes import cuda_build
from ..passes.simplify import simplify
from . import matching, partial_sums

#: elements up to which a constant-size transient lives on the stack (a row of 4096 floats is 16 KiB)
STACK_ELEMENTS = 4096


def count(sdfg: dace.SDFG, where, options: dict) -> int:
    """Library nodes this would expand, or 0 (it only pays where there are reductions to restructure)."""
    if where is not None:
        return 0
    return sum(1 for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nodes.LibraryNode))


def apply(sdfg: dace.SDFG, where, options: dict) -> int:
    if where is not None or not count(sdfg, where, options):
        return 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = _rows(sdfg, top_level=True)
        # an op's nested SDFG that simplify left nested (of a BERT layer's two LayerNorm backwards, the first: 3.2 ms
        # on the BERT-mini layer as 16 maps, its inlined twin 0.3 in rows) is made rows of in place
        for nested in _whole_ops(sdfg):
            fused += _rows(nested, top_level=False)
    return max(fused, 1)


def _rows(sdfg: dace.SDFG, top_level: bool) -> int:
    _expand(sdfg, keep=lambda n, s: isinstance(n, Reduce) and reduce_node.is_column_sum(n, s))
    if top_level:
        simplify(sdfg)
    _split_rows(sdfg)
    fused = _fuse_outermost(sdfg)
    fused += partial_sums.fold(sdfg)
    _expand(sdfg)
    if top_level:
        simplify(sdfg)
    fused += _fuse_outermost(sdfg)  # the column sums left with the maps that add them into the gradients
    fused += _fuse(sdfg, _InnerFusion)
    for state in sdfg.states():
        for node in state.nodes():
            if isinstance(node, nodes.MapEntry) and state.entry_node(node) is None:
                node.map.schedule = dace.ScheduleType.Default  # the build's CPU policy decides
    with temporary_config():
        Config.set("optimizer", "autotile_size", value=STACK_ELEMENTS)
        move_small_arrays_to_stack(sdfg)
    return fused


def _whole_ops(sdfg: dace.SDFG) -> list[dace.SDFG]:
    """The nested SDFGs in ``sdfg``'s own states, outside every map."""
    return [
        node.sdfg
        for state in sdfg.states()
        for node in state.nodes()
        if isinstance(node, nodes.NestedSDFG) and state.entry_node(node) is None
    ]


def to_warps(sdfg: dace.SDFG) -> int:
    """The GPU form of what ``apply`` made: arguments in GPU memory, each row map a kernel with a warp per row, its
    column loops strided over the warp's 32 lanes and their sums into one value per row combined with shuffles
    (DaCe's WarpTiling; every lane gets the result). Returns the row maps so tiled."""
    cuda_build.to_gpu(sdfg)
    tiled = 0
    for state in sdfg.states():
        for entry in [n for n in state.nodes() if isinstance(n, nodes.MapEntry) and state.entry_node(n) is None]:
            if entry.map.schedule != dace.ScheduleType.GPU_Device or not xfh.get_internal_scopes(state, entry):
                continue
            _to_warp(sdfg, state, entry)
            tiled += 1
    return tiled


def _to_warp(sdfg: dace.SDFG, state: dace.SDFGState, entry: nodes.MapEntry) -> None:
    # gap: WarpTiling starts each lane's partial sum from the sum's value, copied in a state it puts first, so
    # before the tasklet that zeroes the sum where that is in the same state (a garbage start), and on a row map's
    # body in its kernel's own state it moves that copy out of the kernel; the body nested, its zeroing tasklets
    # in states of their own before, puts the copy after the zeroing and inside the kernel
    body = xfh.nest_state_subgraph(sdfg, state, state.scope_subgraph(entry, include_entry=False, include_exit=False))
    for inner in list(body.sdfg.states()):
        for tasklet in [n for n in inner.nodes() if isinstance(n, nodes.Tasklet) and inner.in_degree(n) == 0]:
            if inner.entry_node(tasklet) is None:
                xfh.state_fission(SubgraphView(inner, [tasklet, *(e.dst for e in inner.out_edges(tasklet))]))
    # the column loops, sequential per row on the CPU, are what the warp's lanes share
    for node, _ in body.sdfg.all_nodes_recursive():
        if isinstance(node, nodes.MapEntry) and node.map.schedule == dace.ScheduleType.Sequential:
            node.map.schedule = dace.ScheduleType.Default
    # its precondition reads Default maps inside as explicit thread blocks, which the strided loops then become
    warp = WarpTiling.apply_to(sdfg, verify=False, mapentry=entry)
    # gap: WarpTiling routes an empty memlet (an ordering edge) into the warp's map through a connector that leads
    # nowhere inside it, which code generation rejects
    for scope in (warp, state.exit_node(warp)):
        for edge in state.in_edges(scope):
            if edge.data.is_empty() and edge.dst_conn is not None:
                scope.remove_in_connector(edge.dst_conn)
                edge.dst_conn = None
        used = {edge.src_conn for edge in state.out_edges(scope)}
        for connector in [c for c in scope.out_connectors if c not in used]:
            scope.remove_out_connector(connector)


def _fuse_outermost(sdfg: dace.SDFG) -> int:
    return _fuse(sdfg, _OutermostFusion)


def _fuse(sdfg: dace.SDFG, fusion: type[MapFusionVertical]) -> int:
    # MapFusion propagates the memlets of the fused map and the maps around it itself where they can change; the
    # whole SDFG's after every fusion (annotate) took most of the step's time
    return matching.apply_in_rounds(
        lambda: Optimizer(sdfg).get_pattern_matches(patterns=[fusion]), matching.apply_unpropagated
    )


class _InnerFusion(MapFusionVertical):
    """Two loops over the columns inside a row map, the first of which does not accumulate along its loop: a
    reduction's loop fuses into the loop that computes its terms (exp(x - max) into their sum), which GCC vectorizes
    as the build lets it reassociate sums (build.py)."""

    def can_be_applied(self, graph, expr_index: int, sdfg: dace.SDFG, permissive: bool = False) -> bool:
        # which maps first: MapFusion's own test is most of matching's time, and most pairs are not these
        return _inner(self) and super().can_be_applied(graph, expr_index, sdfg, permissive)


class _OutermostFusion(MapFusionVertical):
    """Two maps at the top of the SDFG's state: the rows."""

    def can_be_applied(self, graph, expr_index: int, sdfg: dace.SDFG, permissive: bool = False) -> bool:
        return _outermost(self) and super().can_be_applied(graph, expr_index, sdfg, permissive)


def _inner(match: MapFusionVertical) -> bool:
    state = dace_internals.match_state(match)
    first, second = state.entry_node(match.first_map_exit), match.second_map_entry
    if state.entry_node(second) is None or any(len(e.map.params) != 1 for e in (first, second)):
        return False
    param = first.map.params[0]
    return not any(
        e.data.wcr is not None and param not in map(str, e.data.subset.free_symbols)
        for e in state.in_edges(state.exit_node(first))
    )


def _outermost(match: MapFusionVertical) -> bool:
    state = dace_internals.match_state(match)
    return state.entry_node(match.second_map_entry) is None and state.sdfg is dace_internals.match_sdfg(match)


def _expand(sdfg: dace.SDFG, keep=lambda node, state: False) -> None:
    """Expand every library node but those ``keep`` says to keep, reductions with ours where they fit."""
    expand_onnx_nodes(sdfg)
    while todo := [
        (n, s) for n, s in sdfg.all_nodes_recursive() if isinstance(n, nodes.LibraryNode) and not keep(n, s)
    ]:
        for node, state in todo:
            if isinstance(node, Reduce):
                node.implementation = reduce_node.implementation(node, state)
            node.expand(state)


def _split_rows(sdfg: dace.SDFG) -> None:
    # each map's exit found before any map is split: a split changes the state, and finding an exit after it built
    # the state's scopes again, once per map (27 of fuse_rows' 254 s, profiled, on a 12-layer BERT's backward)
    tops = [
        (state, n, state.exit_node(n))
        for state in sdfg.states()
        for n in state.nodes()
        if isinstance(n, nodes.MapEntry) and state.entry_node(n) is None
    ]
    # a map over exactly the rows (a mean or a variance per row) is one already: splitting it would keep it from
    # fusing with the row maps around it
    rows = {tuple(entry.map.range[:-1]) for _, entry, _ in tops if entry.map.get_param_num() >= 2}
    split: dict[dace.SDFGState, list[nodes.MapEntry]] = defaultdict(list)
    for state, entry, exit_ in tops:
        if entry.map.get_param_num() >= 2 and tuple(entry.map.range) not in rows and not _dynamic_inputs(entry):
            split[state].append(_split_last(state, entry, exit_))
    for state, entries in split.items():
        tree = state.scope_tree()
        propagate_memlets_scope(state.sdfg, state, [tree[e] for e in entries])
    _collapse(sdfg)  # a map that held maps holds them again, under the rows


def _dynamic_inputs(entry: nodes.MapEntry) -> bool:
    """Whether the map's range reads values from its inputs (``_split_last`` carries data inputs only)."""
    return any(not c.startswith("IN_") for c in entry.in_connectors)


def _split_last(state: dace.SDFGState, entry: nodes.MapEntry, exit_: nodes.MapExit) -> nodes.MapEntry:
    """Make ``entry``'s map one over all its dimensions but the last around a sequential map over the last, in one
    pass over its edges; returns the new inner map's entry, whose outer memlets are still to be propagated.

    DaCe's MapExpansion (into a map per dimension, to collapse again) routes every edge through add_memlet_path,
    which builds the state's scope tree again: 44 s of a ResNet-18's fuse_rows step, 4 s this way."""
    outer = entry.map
    inner = nodes.Map(
        f"{outer.label}_{outer.params[-1]}", outer.params[-1:], subsets.Range(outer.range[-1:]),
        schedule=dace.ScheduleType.Sequential,
    )
    inner.range.tile_sizes = outer.range.tile_sizes[-1:]
    tiles = outer.range.tile_sizes[:-1]
    outer.params = outer.params[:-1]
    outer.range = subsets.Range(outer.range[:-1])
    outer.range.tile_sizes = tiles
    inner_entry, inner_exit = nodes.MapEntry(inner), nodes.MapExit(inner)
    state.add_nodes_from([inner_entry, inner_exit])
    entered = set()  # the connectors (None: empty memlets) carried into the inner map so far
    for edge in list(state.out_edges(entry)):
        state.remove_edge(edge)
        if edge.src_conn is None:
            if None not in entered:
                state.add_edge(entry, None, inner_entry, None, Memlet())
                entered.add(None)
            state.add_edge(inner_entry, None, edge.dst, edge.dst_conn, edge.data)
            continue
        name = edge.src_conn[len("OUT_"):]
        if name not in entered:
            inner_entry.add_in_connector(f"IN_{name}")
            inner_entry.add_out_connector(f"OUT_{name}")
            state.add_edge(entry, edge.src_conn, inner_entry, f"IN_{name}", copy.deepcopy(edge.data))
            entered.add(name)
        state.add_edge(inner_entry, f"OUT_{name}", edge.dst, edge.dst_conn, edge.data)
    left = set()  # and out of it; an exit's connector may collect several writes (sums into one array)
    for edge in list(state.in_edges(exit_)):
        state.remove_edge(edge)
        if edge.dst_conn is None:
            state.add_edge(edge.src, edge.src_conn, inner_exit, None, edge.data)
            if None not in left:
                state.add_edge(inner_exit, None, exit_, None, Memlet())
                left.add(None)
            continue
        name = edge.dst_conn[len("IN_"):]
        if name not in left:
            inner_exit.add_in_connector(f"IN_{name}")
            inner_exit.add_out_connector(f"OUT_{name}")
            state.add_edge(inner_exit, f"OUT_{name}", exit_, edge.dst_conn, copy.deepcopy(edge.data))
            left.add(name)
        state.add_edge(edge.src, edge.src_conn, inner_exit, f"IN_{name}", edge.data)
    return inner_entry


def _collapse(sdfg: dace.SDFG) -> None:
    """Collapse each pair of nested maps whose inner map is not innermost (its body holds another map), in rounds
    until none is left; memlets are propagated once, from the maps collapsed (after each collapse, the scope tree
    this needed took a third of a ResNet-18's fuse_rows step)."""
    collapsed: dict[dace.SDFGState, list[nodes.MapEntry]] = defaultdict(list)
    applied = True
    while applied:
        applied = False
        pairs = [(state, outer) for state in sdfg.states() for outer in state.nodes() if _inner_map(state, outer)]
        for state, outer in pairs:
            inner = _inner_map(state, outer) if outer in state.nodes() else None
            if inner is None:  # changed by a collapse before it in this round
                continue
            # the split made the inner map sequential; collapsed, the rows keep the outer schedule
            inner.map.schedule = outer.map.schedule
            if MapCollapse.can_be_applied_to(sdfg, outer_map_entry=outer, inner_map_entry=inner):
                entry, _ = MapCollapse.apply_to(sdfg, annotate=False, outer_map_entry=outer, inner_map_entry=inner)
                collapsed[state].append(entry)
                applied = True
    for state, entries in collapsed.items():
        tree = state.scope_tree()
        propagate_memlets_scope(state.sdfg, state, [tree[e] for e in entries if e in tree])


def _inner_map(state: dace.SDFGState, outer: nodes.Node) -> nodes.MapEntry | None:
    """The map nested alone in ``outer`` whose body holds another map, if ``outer`` is a map entry with one."""
    if not isinstance(outer, nodes.MapEntry):
        return None
    inner = {e.dst for e in state.out_edges(outer)}
    if len(inner) != 1 or not isinstance(next(iter(inner)), nodes.MapEntry):
        return None
    inner = next(iter(inner))
    return inner if any(isinstance(e.dst, nodes.MapEntry) for e in state.out_edges(inner)) else None
