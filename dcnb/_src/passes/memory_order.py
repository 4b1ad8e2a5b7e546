"""A parallel map's dimensions in its arrays' memory order: a policy each CPU build applies to the SDFG it compiles.

gap: DaCe's maps iterate in the order of their parameters, the last innermost, whatever the strides of the arrays
they index: over channels-last arrays (the ``channels_last`` action) an elementwise map over (n, c, h, w) moved C
elements at every step of its inner loop, which neither vectorizes nor uses a cache line's other channels. A map
over such an image whose every element access moves by one element or not at all along one parameter, and by one
along it somewhere, gets that parameter last; the others keep their order. Only the order of independent
iterations changes; maps over arrays of the default layout keep theirs (``map_permutation`` chooses it).

ONNX ops over a channels-last image expand here, not at code generation as the others do:
their maps then go through this pass and the build's others (a ResNet-50's ReLUs over channels-last images, expanded
at code generation in (n, c, h, w) order, took 257 ms of a 1405 ms step at 4x3x224x224).
"""

from __future__ import annotations

import dace
from dace import dtypes, subsets
from dace.libraries.onnx.nodes.onnx_op import ONNXOp
from dace.sdfg import nodes
from dace.transformation.onnx.optimize import expand_onnx_nodes

from .. import dace_internals
from ..fixes.cpp import channels_last, contiguous
from .schedule import _inside_map
from .simd_loops import step


def apply(sdfg: dace.SDFG) -> int:
    """Move the parameter each outermost map's accesses are contiguous along to the end; returns how many maps
    changed. Runs before ``schedule.apply``, which collapses the leading dimensions."""
    _expand_ops_over_channels_last(sdfg)
    changed = 0
    for state in [s for nested in sdfg.all_sdfgs_recursive() for s in nested.states()]:
        if _inside_map(state.sdfg):
            continue
        children = state.scope_children()
        for entry in children[None]:
            if not isinstance(entry, nodes.MapEntry) or len(entry.map.params) < 2:
                continue
            along = _contiguous_along(state, entry, children[entry])
            if along is None or along == entry.map.params[-1]:
                continue
            index = entry.map.params.index(along)
            order = [i for i in range(len(entry.map.params)) if i != index] + [index]
            entry.map.params = [entry.map.params[i] for i in order]
            entry.map.range = subsets.Range([entry.map.range[i] for i in order])
            changed += 1
    return changed


def _contiguous_along(state: dace.SDFGState, entry: nodes.MapEntry, body: list) -> str | None:
    """The parameter of ``entry``'s map that every element access in its body (tasklets and arrays only) moves
    along by one element or not at all, and some by one; None where there is none, or more than one, or where the
    map reads and writes no channels-last image (its order is then its own: ``map_permutation`` may have chosen
    it)."""
    if any(not isinstance(n, (nodes.Tasklet, nodes.AccessNode, nodes.MapExit)) for n in body):
        return None
    if entry.map.schedule not in (dtypes.ScheduleType.Default, dtypes.ScheduleType.CPU_Multicore):
        return None
    if any(r[2] != 1 for r in entry.map.range):
        return None
    edges = [
        e
        for node in body
        if not isinstance(node, nodes.MapExit)
        for e in (*state.in_edges(node), *state.out_edges(node))
        if not e.data.is_empty() and state.sdfg.arrays[e.data.data].total_size != 1
    ]
    # (judged first: every CPU build asks of every map, and the offsets below are sympy's work)
    if not any(_channels_last(state.sdfg.arrays[e.data.data]) for e in edges):
        return None
    if any(e.data.subset.num_elements() != 1 for e in edges):
        return None
    steps = {p: {step(e.data, state.sdfg.arrays[e.data.data], p) for e in edges} for p in entry.map.params}
    found = [p for p, seen in steps.items() if seen <= {0, 1} and 1 in seen]
    return found[0] if len(found) == 1 else None


def _expand_ops_over_channels_last(sdfg: dace.SDFG) -> None:
    """Expand the ONNX ops that read or write a channels-last image."""
    chosen = set()
    for state in [s for nested in sdfg.all_sdfgs_recursive() for s in nested.states()]:
        for node in state.nodes():
            if isinstance(node, ONNXOp) and any(
                not e.data.is_empty() and _channels_last(state.sdfg.arrays[e.data.data])
                for e in (*state.in_edges(node), *state.out_edges(node))
            ):
                chosen.add(node)
    if chosen:
        with dace_internals.expansions_reused():  # those of identical layers expand once
            expand_onnx_nodes(sdfg, predicate=lambda node: node in chosen)


def _channels_last(desc: dace.data.Data) -> bool:
    # (an image of one channel, or of one pixel, is laid out both ways)
    return len(desc.shape) >= 3 and channels_last(desc) and not contiguous(desc)
