"""DaCe's auto_optimize, its own parts in its order (``PIPELINE``), with its greedy fusion made to scale with the
graph: the map fusion that opens it, and the test of each set of maps its subgraph fusion tries (``_fusible``, and
``topologically_feasible`` in place of DaCe's recursive walk, wherever SubgraphFusion is tested); and its repeated
transformations applied state by state (``repeated_in_each_state``).

gap: DaCe's ``greedy_fuse`` opens with ``FullMapFusion``, whose ``MapFusionHorizontal`` matches every pair of maps
in a state, walks the graph twice per pair to see whether they are parallel, applies one fusion and starts the
matching again: a ResNet-18's backward (1466 nodes) spent 11 minutes there, the whole step 12. Here the pairs are
found from one reachability table per state, grouped by scope, schedule and ranges, and each is fused by DaCe's
MapFusionHorizontal after its own test; vertical fusion is DaCe's MapFusionVertical, each match tested and applied
in rounds (``_fuse_maps_vertically``); every other part is called as auto_optimize calls it. The result is DaCe's
(a ResNet-18's SDFGs after it had the build key they had; a ViT's backward the same maps and nodes, independent
tasklets of a map in another order) but for small transients inside maps, which go on the stack
(``_small_arrays_on_the_heap_to_the_stack``).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Iterator

import dace
from dace import data as dt
from dace import symbolic
from dace.sdfg import infer_types, nodes
from dace.sdfg import utils as sdutil
from dace.sdfg.graph import SubgraphView
from dace.sdfg.state import SDFGState
from dace.transformation.auto import auto_optimize as dace_auto
from dace.transformation.dataflow import (
    MapCollapse,
    MapFusionHorizontal,
    MapFusionVertical,
    TrivialMapElimination,
    map_fusion_helper,
)
from dace.transformation.estimator.enumeration import GreedyEnumerator
from dace.transformation.interstate import LoopToMap, MoveLoopIntoMap
from dace.transformation.passes import analysis as ap
from dace.transformation.subgraph import CompositeFusion, SubgraphFusion
from dace.transformation.subgraph import helpers as subgraph_helpers

from .. import dace_internals
from . import cuda_build
from .before_autodiff import whole_arrays_for_ops
from .simplify import simplify

Library = Callable[[dace.DeviceType], list[str]]


def _reachable(state: SDFGState, index: dict[nodes.Node, int]) -> dict[nodes.Node, int]:
    """Each node's descendants in ``state``, as a bit set over ``index`` (the state's node order)."""
    below: dict[nodes.Node, int] = {}
    for node in reversed(list(sdutil.dfs_topological_sort(state))):
        bits = 0
        for edge in state.out_edges(node):
            bits |= below[edge.dst] | (1 << index[edge.dst])
        below[node] = bits
    return below


def _parallel_pairs(state: SDFGState) -> Iterator[tuple[nodes.MapEntry, nodes.MapEntry]]:
    """Pairs of maps of ``state`` that could be fused side by side: the same scope, schedule and ranges (in any
    order of their parameters), neither reachable from the other; in the state's node order."""
    index = {node: i for i, node in enumerate(state.nodes())}
    below = _reachable(state, index)
    scope = state.scope_dict()
    alike: dict[tuple, list[nodes.MapEntry]] = defaultdict(list)
    for node in state.nodes():
        if isinstance(node, nodes.MapEntry):
            alike[scope[node], node.map.schedule, tuple(sorted(map(str, node.map.range)))].append(node)
    for group in alike.values():
        for first, second in itertools.combinations(group, 2):
            if not (below[first] >> index[second]) & 1 and not (below[second] >> index[first]) & 1:
                yield first, second


def _unshadow(state: SDFGState, first: nodes.Map, second: nodes.MapEntry) -> None:
    """Rename the parameters of the maps inside ``second``'s scope that a fusion with ``first`` would rename
    ``second``'s own parameters to.

    gap: DaCe's map fusions rename the second map's parameters to the first's over its whole scope, maps nested in it
    included, without looking at their parameters: where one of them had the new name, the renamed indices became
    that map's (LeViT's HardSwish fused after a transpose wrote only [i, j, j] of its output, the rest left as the
    buffer held it: infinities)."""
    renamed = set((map_fusion_helper.find_parameter_remapping(first, second.map) or {}).values())
    if not renamed:
        return
    scope = state.scope_subgraph(second, include_entry=False).nodes()
    inner = [n for n in scope if isinstance(n, nodes.MapEntry) and renamed & set(n.map.params)]
    if not inner:
        return
    taken = set(state.sdfg.symbols) | {p for n in state.nodes() if isinstance(n, nodes.MapEntry) for p in n.map.params}
    parent = state.scope_dict()

    def depth(node: nodes.Node) -> int:
        return 0 if parent[node] is None else 1 + depth(parent[node])

    # innermost first: a renaming over a map's scope must not reach a map inside it with a parameter of that name
    for entry in sorted(inner, key=depth, reverse=True):
        fresh = {}
        for param in (p for p in entry.map.params if p in renamed):
            fresh[param] = next(f"{param}_{k}" for k in itertools.count() if f"{param}_{k}" not in taken)
            taken.add(fresh[param])
        symbolic.safe_replace(fresh, state.scope_subgraph(entry).replace_dict)
        entry.map.params = [fresh.get(p, p) for p in entry.map.params]


def _fuse_parallel_maps(sdfg: dace.SDFG) -> int:
    # MapFusionHorizontal applied pair by pair from _parallel_pairs, each pair verified by DaCe's own test; the
    # table is made again only after a fusion changed the state
    applied = 0
    for nested in list(sdfg.all_sdfgs_recursive()):
        for state in list(nested.states()):
            refused: set[tuple[nodes.MapEntry, nodes.MapEntry]] = set()
            fused = True
            while fused:
                fused = False
                for first, second in _parallel_pairs(state):
                    if (first, second) in refused:
                        continue
                    _unshadow(state, first.map, second)
                    try:
                        MapFusionHorizontal.apply_to(
                            nested, annotate=False, save=False,
                            first_parallel_map_entry=first, second_parallel_map_entry=second,
                        )
                    except ValueError:  # DaCe's own test refused it
                        refused.add((first, second))
                        continue
                    applied += 1
                    fused = True
                    break
    return applied


def _chains(state: SDFGState) -> list[tuple[nodes.MapExit, nodes.AccessNode, nodes.MapEntry]]:
    """MapFusionVertical's pattern in ``state``: a map's exit, an array it writes, a map entry reading that array."""
    return [
        (exit_, first.dst, second.dst)
        for exit_ in state.nodes() if isinstance(exit_, nodes.MapExit)
        for first in state.out_edges(exit_) if isinstance(first.dst, nodes.AccessNode)
        for second in state.out_edges(first.dst) if isinstance(second.dst, nodes.MapEntry)
    ]


_PATTERN = (MapFusionVertical.first_map_exit, MapFusionVertical.array, MapFusionVertical.second_map_entry)


def _fuse_maps_vertically(sdfg: dace.SDFG) -> int:
    """What DaCe's FullMapFusion does without horizontal fusion (strict dataflow), to the same fixed point: each
    match of MapFusionVertical tested by its own ``can_be_applied`` and applied as FullMapFusion applies it, in rounds
    over each state's matches until a round applies none.

    gap: FullMapFusion's pattern matching starts again at the SDFG's first state after every fusion it applies, and
    tests every match before it again (4 ms each): ViT-B/16's backward spent 315 s of its auto_optimize there, 19x
    its time at 4 of its 12 layers. Here a round tests each match once; a match refused before a fusion nearby is
    tested again in the next round."""
    single_use = ap.FindSingleUseData().apply_pass(sdfg, {})
    results = {ap.FindSingleUseData.__name__: single_use}
    applied = 0
    for region in list(sdfg.all_control_flow_regions(recursive=True)):
        for state in [b for b in region.nodes() if isinstance(b, SDFGState)]:
            fused = True
            while fused:
                fused = False
                index = {node: i for i, node in enumerate(state.nodes())}
                for chain in _chains(state):
                    if not all(node in index for node in chain) or not _still_chained(state, *chain):
                        continue
                    fusion = MapFusionVertical(strict_dataflow=True, _single_use_data=single_use)
                    fusion.setup_match(state.sdfg, region.cfg_id, state.block_id,
                                       {p: index[node] for p, node in zip(_PATTERN, chain)}, 0)
                    try:
                        if not fusion.can_be_applied(state, 0, state.sdfg):
                            continue
                    except Exception:  # noqa: BLE001 -- DaCe's pattern matching skips a match whose test raises
                        continue
                    fusion._pipeline_results = results
                    _unshadow(state, chain[0].map, chain[2])
                    fusion.apply(state, state.sdfg)
                    applied += 1
                    fused = True
                    index = {node: i for i, node in enumerate(state.nodes())}
    return applied


def _still_chained(state: SDFGState, exit_: nodes.MapExit, array: nodes.AccessNode, entry: nodes.MapEntry) -> bool:
    # a fusion earlier in the round may have rewired a match found before it
    return any(e.dst is array for e in state.out_edges(exit_)) and any(e.dst is entry for e in state.out_edges(array))


def fuse_maps(sdfg: dace.SDFG) -> None:
    """FullMapFusion's vertical and horizontal map fusion, to a fixed point, over ``sdfg`` and its nested SDFGs."""
    while True:
        _fuse_maps_vertically(sdfg)
        if not _fuse_parallel_maps(sdfg):
            break


def _greedy_fuse(sdfg: dace.SDFG, recursive: bool = True, stencil: bool = False) -> bool:
    # what DaCe's greedy_fuse does given an SDFG: fuse_maps in place of its FullMapFusion, then each state's
    # subgraphs; returns whether a subgraph was fused after the last map fusion
    simplify(sdfg, validate=False)
    fuse_maps(sdfg)
    changed = False
    for state in list(sdfg.states()):
        if changed:  # DaCe fuses maps vertically before each state; unchanged since fuse_maps, none would fuse
            _fuse_maps_vertically(sdfg)
        changed = _fuse_subgraphs(sdfg, state, SubgraphView(state, state.nodes()), recursive, stencil)
    return changed


def _fuse_subgraphs(sdfg: dace.SDFG, state: SDFGState, scope: SubgraphView, recursive: bool, stencil: bool) -> bool:
    """What DaCe's greedy_fuse does given a state or a scope: CompositeFusion applied to each set of maps its greedy
    enumeration finds, into the fused scopes and nested SDFGs; the enumeration tests a set with :func:`_fusible`.
    Returns whether a fusion was applied."""
    condition = _composite(stencil)
    changed = False
    for entries in GreedyEnumerator(sdfg, state, scope, condition_function=_fusible(condition)):
        entry = entries[0]
        if len(entries) > 1:
            fusion = _composite(stencil)
            fusion.setup_match(subgraph_helpers.subgraph_from_maps(sdfg, state, entries))
            fusion.apply(sdfg)
            entry = dace_internals.fused_entry(fusion)
            changed = True
        if recursive:
            inner = state.scope_subgraph(entry, include_entry=False, include_exit=False)
            changed |= _fuse_subgraphs(sdfg, state, inner, recursive, stencil)
    for node in scope.nodes():
        if isinstance(node, nodes.NestedSDFG):
            changed |= _greedy_fuse(node.sdfg, recursive, stencil)
    return changed


def _composite(stencil: bool) -> CompositeFusion:
    # greedy_fuse's settings; its only one for GPUs (loop unrolling) it sets on its test, which does not read it
    fusion = CompositeFusion()
    fusion.allow_tiling = stencil
    fusion.expansion_split = False
    if stencil:
        fusion.schedule_innermaps = dace.ScheduleType.Sequential
    return fusion


def _fusible(condition: CompositeFusion) -> Callable[[dace.SDFG, SubgraphView], bool]:
    """``condition``'s test, its answers unchanged, that looks where the maps sit before it copies the SDFG.

    gap: CompositeFusion deep-copies the whole SDFG for each set of maps it could expand to a common outer map, to
    test fusion on the expanded copy: 73 tests and 22 s of a ResNet-18's auto_optimize. Each of its tests needs the
    maps' neighbours to be fusible (no array between them also written from outside; no path out of the set back
    into it), and expansion does not change them: it splits a map inside its own scope. Where it still copies, the
    copy shares with the SDFG what the test does not change (``dace_internals.unchanged_shared_in_copies``).
    """

    def test(sdfg: dace.SDFG, subgraph: SubgraphView) -> bool:
        state = subgraph.graph
        entries = subgraph_helpers.get_outermost_scope_maps(sdfg, state, subgraph)
        try:
            _, between, out = SubgraphFusion.get_adjacent_nodes(sdfg, state, entries)
        except NotImplementedError:
            return False
        if not SubgraphFusion.check_topo_feasibility(sdfg, state, entries, between, out):
            return False
        with dace_internals.unchanged_shared_in_copies(sdfg, subgraph, entries):
            return condition.can_be_applied(sdfg, subgraph)

    return test


def topologically_feasible(sdfg: dace.SDFG, state: SDFGState, entries, between, out) -> bool:
    """SubgraphFusion's test that no path leaves a set of maps (``entries``) through the arrays between them and
    after them (``between``, ``out``) and comes back into one of them, with its answers, walked by iteration.

    gap: DaCe's ``check_topo_feasibility`` walks every node below those arrays recursively, a frame per node: a state
    more than ~1000 nodes deep below them raised RecursionError (EfficientNet-B0's auto_optimize)."""
    entries = set(entries)
    stack = [e.dst for node in (*between, *out) for e in state.out_edges(node) if e.dst not in entries]
    seen = set(stack)
    while stack:
        for edge in state.out_edges(stack.pop()):
            if edge.dst in entries:
                return False
            if edge.dst not in seen:
                seen.add(edge.dst)
                stack.append(edge.dst)
    return True


dace_internals.replace_topo_feasibility(topologically_feasible)


def repeated_in_each_state(sdfg: dace.SDFG, transformation: type) -> int:
    """``sdfg.apply_transformations_repeated(transformation)`` for a transformation within one state, state by state
    through ``sdfg`` and its nested SDFGs; returns how many it applied.

    gap: DaCe's repeated application matches again from the SDFG's first state after each one it applies: the
    nested SDFGs of a ViT-B/16's backward (1,096 of them before simplify inlines them) were each searched again
    for each of the 706 trivial maps taken away, 36 s. Applied in one state, such a transformation changes no other
    state's matches, so the result is the same."""
    applied = 0
    for nested in list(sdfg.all_sdfgs_recursive()):
        for state in list(nested.states()):
            applied += nested.apply_transformations_repeated(transformation, validate=False, states=[state])
    return applied


def _simplify_and_parallelize(sdfg: dace.SDFG, device: dace.DeviceType, library: Library | None) -> None:
    repeated_in_each_state(sdfg, TrivialMapElimination)
    while True:
        simplify(sdfg, validate=False)
        if not sdfg.apply_transformations_repeated(LoopToMap, validate=False):
            break
    simplify(sdfg)
    repeated_in_each_state(sdfg, MapCollapse)
    if device == dace.DeviceType.GPU:
        cuda_build.arguments_in_gpu_memory(sdfg)
        sdfg.apply_gpu_transformations(simplify=False)
        simplify(sdfg)


def _fuse(sdfg: dace.SDFG, device: dace.DeviceType, library: Library | None) -> None:
    sdfg.reset_cfg_list()
    _greedy_fuse(sdfg)
    _greedy_fuse(sdfg, recursive=False, stencil=True)
    sdfg.apply_transformations_repeated([MoveLoopIntoMap])


def _tile_and_collapse(sdfg: dace.SDFG, device: dace.DeviceType, library: Library | None) -> None:
    for nested in list(sdfg.all_sdfgs_recursive()):
        dace_auto.tile_wcrs(nested, False)
    repeated_in_each_state(sdfg, MapCollapse)


#: DaCe's implementations that include a GPU library's own headers and link it: dcnb reaches cuBLAS through
#: gpu_libs.h (whose declarations clash with cublas_v2.h), and cuTENSOR and cuSOLVER are not installed with CUDA
GPU_LIBRARIES_BLOCKED = ["cuBLAS", "cuTENSOR", "cuSolverDn"]


def _libraries(sdfg: dace.SDFG, device: dace.DeviceType, library: Library | None) -> None:
    # gap: DaCe's TensorTranspose checks its arrays' whole shapes, and simplify had made part of an array (YOLOS's
    # position embeddings but the first) its input: "The permutation of the input shape does not match"
    whole_arrays_for_ops(sdfg)
    blocked = GPU_LIBRARIES_BLOCKED if device == dace.DeviceType.GPU else None
    dace_auto.set_fast_implementations(sdfg, device, blocklist=blocked, find_fast_library_fn=library)
    infer_types.infer_connector_types(sdfg)
    infer_types.set_default_schedule_and_storage_types(sdfg, None)
    if device == dace.DeviceType.GPU:
        # expanded when the code is generated, as in the naive step's CUDA build: expanded here, the host call
        # into cuBLAS ended up inside a kernel ("identifier __state is undefined")
        return
    sdfg.expand_library_nodes()


def _storage(sdfg: dace.SDFG, device: dace.DeviceType, library: Library | None) -> None:
    for nested in sdfg.all_sdfgs_recursive():
        nested.openmp_sections = False
    if device == dace.DeviceType.CPU:
        _small_arrays_on_the_heap_to_the_stack(sdfg)
    dace_auto.move_small_arrays_to_stack(sdfg)
    dace_auto.make_transients_persistent(sdfg, device)
    sdfg.reset_cfg_list()


def _small_arrays_on_the_heap_to_the_stack(sdfg: dace.SDFG) -> None:
    # gap: _libraries sets the storage DaCe infers, the CPU heap, on the transients inside maps before
    # move_small_arrays_to_stack, which moves only those of Default storage: each iteration of a map then allocated
    # and freed every one-element transient MapFusion made (a BERT encoder's embedding gradients: 0.41 of 2 ms)
    limit = dace.Config.get("optimizer", "autotile_size")
    for nested, _, desc in sdfg.arrays_recursive():
        if (
            type(desc) is dt.Array
            and desc.transient
            and desc.storage == dace.StorageType.CPU_Heap
            and desc.lifetime == dace.AllocationLifetime.Scope
            and not dace.symbolic.issymbolic(desc.total_size, nested.constants)
            and dace.symbolic.evaluate(desc.total_size, nested.constants) <= limit
        ):
            desc.storage = dace.StorageType.Register


#: DaCe auto_optimize's parts, in its order
PIPELINE = (_simplify_and_parallelize, _fuse, _tile_and_collapse, _libraries, _storage)


def run(sdfg: dace.SDFG, device: dace.DeviceType, library: Library | None = None) -> None:
    """Apply the pipeline to ``sdfg`` in place; ``library`` puts implementations first, as DaCe's
    ``find_fast_library_fn`` does."""
    for part in PIPELINE:
        part(sdfg, device, library)
    sdfg.validate()
