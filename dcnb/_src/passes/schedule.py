"""How generated CPU code shares maps among threads: a policy each CPU build applies to the SDFG it compiles.

- A map with fewer than GRAIN iterations and no loops inside runs on one thread. Starting an OpenMP parallel region costs
  microseconds on an idle machine and milliseconds on a busy one: more than such a map's work. (PyTorch's
  intra-op threshold is the same 32768 elements.)
- A parallel map whose outermost dimension has too few iterations to share out evenly among the threads is
  collapsed (OpenMP collapse) over as many leading dimensions as it takes to have CHUNKS iterations per thread.
- A sum into an array where each iteration of the maps around it adds into elements of its own is a plain
  addition (``own_element_sums``), not an atomic one.

One rule holds on both devices, and the CUDA build applies it too: a sum into a transient that each iteration of a
map allocates for itself is a plain addition (``iteration_sums``).
"""

from __future__ import annotations

import collections
import os

import dace
from dace.sdfg import nodes

GRAIN = 32768
CHUNKS = 8
_PARALLEL = (dace.ScheduleType.Default, dace.ScheduleType.CPU_Multicore)


def threads() -> int:
    """The threads OpenMP will use here."""
    try:
        return max(1, int(os.environ["OMP_NUM_THREADS"].split(",")[0]))
    except (KeyError, ValueError):
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def apply(sdfg: dace.SDFG) -> None:
    """Set the schedule and collapse of every outermost map in ``sdfg`` (and in nested SDFGs outside maps)."""
    workers = threads()
    for node, state in sdfg.all_nodes_recursive():
        if not isinstance(node, nodes.MapEntry) or node.map.schedule not in _PARALLEL:
            continue
        if state.entry_node(node) is not None or _inside_map(state.sdfg):
            continue
        sizes = [_extent(r) for r in node.map.range]
        if any(s is None for s in sizes):
            continue  # symbolic sizes: leave it to DaCe
        total = 1
        for s in sizes:
            total *= s
        if total < GRAIN and not _has_inner_work(state, node):
            node.map.schedule = dace.ScheduleType.Sequential
            continue
        node.map.schedule = dace.ScheduleType.CPU_Multicore
        collapse, iterations = 1, sizes[0]
        while iterations < CHUNKS * workers and collapse < len(sizes):
            iterations *= sizes[collapse]
            collapse += 1
        node.map.collapse = collapse


def own_element_sums(sdfg: dace.SDFG) -> int:
    """Make the write-conflict resolutions that no two iterations share non-atomic; returns how many edges changed.

    gap: DaCe's CPU code makes every write-conflict resolution in a parallel map an atomic addition (a
    compare-and-swap loop), even where each iteration adds into elements of its own, such as the maps that add a
    gradient's parts into it: 0.45 ms each on a BERT-mini layer, 1.5 ms once vectorized (four per backward). Such
    an index takes one map parameter per dimension, each with a step that moves past what an iteration writes there,
    and every parameter of the maps around it; nothing else runs beside a map while the SDFG's OpenMP sections are
    off.
    """
    changed = 0
    sums: list[tuple[dace.SDFGState, object, dict, object]] = []
    for node, state in sdfg.all_nodes_recursive():
        if not isinstance(node, nodes.Tasklet) or state.sdfg.openmp_sections or _inside_map(state.sdfg):
            continue
        ranges, outermost = {}, None
        entry = state.entry_node(node)
        while entry is not None:
            ranges.update(zip(entry.map.params, entry.map.range))
            outermost, entry = entry, state.entry_node(entry)
        sums += [(state, outermost, ranges, e) for e in state.out_edges(node) if e.data.wcr is not None]
    # an array that a map's iterations add into at two indices (x[i] and x[i + 1], the gradient of x[1:] - x[:-1]) is
    # shared between iterations even where each index alone is not; two edges to one index (a square's gradient,
    # x * x: one per factor) stay within the iteration, whose additions run one after the other
    indices = collections.defaultdict(set)
    for state, outermost, _, edge in sums:
        indices[id(state), id(outermost), edge.data.data].add(str(edge.data.subset))
    for state, outermost, ranges, edge in sums:
        memlet = edge.data
        if memlet.wcr_nonatomic or len(indices[id(state), id(outermost), memlet.data]) > 1:
            continue
        if not ranges or not _own_elements(memlet.subset, ranges):
            continue
        for e in state.memlet_path(edge):
            e.data.wcr_nonatomic = True
        changed += 1
    return changed


def iteration_sums(sdfg: dace.SDFG) -> int:
    """Make the sums into a transient that each iteration of a map allocates for itself non-atomic; returns how many
    edges changed.

    gap: DaCe's code makes them atomic. auto_optimize's subgraph fusion leaves a gradient so, summed from its parts in
    each iteration of the fused map: on the CPU a cost (EfficientNet's backward spent 3 ms of 5.7 in five of them), on
    a GPU an atomic addition into the thread's own registers, which is no address atomics take (auto_optimize's
    backward stopped with "unspecified launch failure" on seven models on an H100)."""
    changed = 0
    for nested in sdfg.all_sdfgs_recursive():
        for state, edge in ((s, e) for s in nested.states() for e in s.edges()):
            if edge.data.wcr is None or edge.data.wcr_nonatomic or not _of_the_iteration(state, edge):
                continue
            edge.data.wcr_nonatomic = True
            changed += 1
    return changed


def _of_the_iteration(state: dace.SDFGState, edge) -> bool:
    """Whether ``edge`` adds into a transient every access of which sits in the one map scope the edge is in: DaCe
    allocates it there, one per iteration (in a kernel, one per thread: not in shared memory, which a map of a
    block's threads inside that scope would make it)."""
    target = edge.dst
    if not isinstance(target, nodes.AccessNode):
        return False
    entry, desc = state.entry_node(target), state.sdfg.arrays[target.data]
    if entry is None or not desc.transient or desc.lifetime != dace.AllocationLifetime.Scope:
        return False
    if desc.storage == dace.StorageType.GPU_Shared or _has_block_maps(state, entry):
        return False
    return all(
        s is state and state.entry_node(n) is entry
        for s in state.sdfg.states()
        for n in s.data_nodes()
        if n.data == target.data
    )


def _has_block_maps(state: dace.SDFGState, entry: nodes.MapEntry) -> bool:
    """Whether a map of a block's threads runs inside the scope of ``entry``."""
    return any(
        isinstance(n, nodes.MapEntry) and n.map.schedule == dace.ScheduleType.GPU_ThreadBlock
        for n in state.scope_subgraph(entry, include_entry=False, include_exit=False).nodes()
    )


def _own_elements(subset, ranges: dict[str, tuple]) -> bool:
    """Whether the box ``subset`` of each iteration of maps with parameters ``ranges`` (parameter -> its range)
    meets no other iteration's: each parameter in a dimension of its own, as ``begin + k * param`` with a constant
    ``k``, and ``k`` times the map's step at least the box's extent there; a parameter the box does not name is that
    of a map of tiles, each of whose iterations an inner parameter's range moves past (fuse_rows' chunks of rows)."""
    if subset is None:
        return False
    seen = set()
    for begin, end, _ in subset.ndrange():
        begin = dace.symbolic.pystr_to_symbolic(begin)
        extent = dace.symbolic.pystr_to_symbolic(end) - begin + 1
        used = [s for s in begin.free_symbols if str(s) in ranges]
        if len(used) > 1 or not extent.is_number:
            return False
        if used:
            k = begin.diff(used[0]) * dace.symbolic.pystr_to_symbolic(ranges[str(used[0])][2])
            if not k.is_number or abs(k) < extent:
                return False
            seen.add(str(used[0]))
    return all(any(_tiled(ranges[inner], outer, ranges[outer][2]) for inner in seen) for outer in set(ranges) - seen)


def _tiled(inner: tuple, outer: str, step) -> bool:
    """Whether the range ``inner`` moves past all it covers each time parameter ``outer`` moves by ``step``."""
    # a map tiled unevenly (map_tiling) ends its tiles at a Min, a SymExpr: sympy's expression is inside it
    exprs = (v.expr if isinstance(v, dace.symbolic.SymExpr) else v for v in inner[:2])
    begin, end = (dace.symbolic.pystr_to_symbolic(v) for v in exprs)
    symbol = next((s for s in begin.free_symbols if str(s) == outer), None)
    if symbol is None or (end - begin).free_symbols:
        return False
    moved = begin.diff(symbol) * dace.symbolic.pystr_to_symbolic(step)
    return moved.is_number and moved >= end - begin + 1


def _has_inner_work(state: dace.SDFGState, entry: nodes.MapEntry) -> bool:
    """Whether a map's body holds loops of its own (nested maps or SDFGs): its iterations are not small."""
    return any(
        isinstance(n, (nodes.MapEntry, nodes.NestedSDFG, nodes.LibraryNode))
        for n in state.scope_subgraph(entry, include_entry=False, include_exit=False).nodes()
    )


def _extent(rng) -> int | None:
    begin, end, step = rng
    size = (end - begin + 1) // step if all(getattr(v, "is_Integer", isinstance(v, int)) for v in rng) else None
    if size is None:
        return None
    return max(int(size), 0) + (1 if (int(end) - int(begin) + 1) % int(step) else 0)


def _inside_map(sdfg: dace.SDFG) -> bool:
    """Whether ``sdfg`` is nested in a map scope (where DaCe runs maps sequentially anyway)."""
    while sdfg.parent_nsdfg_node is not None:
        if sdfg.parent.entry_node(sdfg.parent_nsdfg_node) is not None:
            return True
        sdfg = sdfg.parent_sdfg
    return False
