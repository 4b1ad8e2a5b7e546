"""How generated CPU code shares maps among threads: a policy each CPU build applies to the SDFG it compiles.

- A map with fewer than GRAIN iterations and no loops inside runs on one thread. Starting an OpenMP parallel region costs
  microseconds on an idle machine and milliseconds on a busy one: more than such a map's work. (PyTorch's
  intra-op threshold is the same 32768 elements.)
- A parallel map whose outermost dimension has too few iterations to share out evenly among the threads is
  collapsed (OpenMP collapse) over as many leading dimensions as it takes to have CHUNKS iterations per thread.
"""

from __future__ import annotations

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
