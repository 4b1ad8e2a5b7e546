"""A map added at the top level of a state, its outer memlets propagated from the map alone: what the passes that
add maps to a whole network's state use in place of ``SDFGState.add_mapped_tasklet``'s propagation.

gap: ``add_mapped_tasklet(external_edges=True)`` propagates each outer memlet through ``propagate_memlet``, which
rebuilds the whole state's scope dictionary (the state just changed) and resolves the symbols of every array of the
SDFG anew on every call: a pass adding one map per gradient (or per array it zeroes) grew with the square of the
network (ResNet-50's backward: 25 of the 57 s that autodiff and its passes took).
"""

from __future__ import annotations

import dace
from dace.sdfg import nodes
from dace.sdfg.propagation import propagate_subset


def add_top_level_map(
    state: dace.SDFGState,
    name: str,
    ranges: dict[str, str],
    inputs: dict[str, dace.Memlet],
    code: str,
    outputs: dict[str, dace.Memlet],
    input_nodes: dict[str, nodes.AccessNode] | None = None,
    output_nodes: dict[str, nodes.AccessNode] | None = None,
) -> tuple[nodes.Tasklet, nodes.MapEntry, nodes.MapExit]:
    """``state.add_mapped_tasklet(..., external_edges=True)`` for a map at the top level of ``state``, between
    ``input_nodes`` and ``output_nodes`` (top-level access nodes; new ones for the arrays they leave out), with the
    outer memlets DaCe's propagation gives: at the top level every symbol but the map's parameters is defined, which
    is what ``propagate_subset`` takes without being told (``propagate_memlet`` asks the state)."""
    made = state.add_mapped_tasklet(
        name,
        ranges,
        inputs,
        code,
        outputs,
        external_edges=True,
        input_nodes=input_nodes,
        output_nodes=output_nodes,
        propagate=False,
    )
    _, entry, exit_node = made
    # without propagation the outer edge holds its inner edge's memlet: each gets one of its own, as it would have
    sides = [(e, state.out_edges(entry), "OUT_" + e.dst_conn[3:], False) for e in state.in_edges(entry)]
    sides += [(e, state.in_edges(exit_node), "IN_" + e.src_conn[4:], True) for e in state.out_edges(exit_node)]
    for outer, inside, connector, use_dst in sides:
        inner = [e for e in inside if (e.dst_conn if use_dst else e.src_conn) == connector]
        # propagate_memlet's union: the last inner memlet of the array, after those unequal to it
        memlets = [e.data for e in inner[:-1] if e.data != inner[-1].data] + [inner[-1].data]
        arr = state.sdfg.arrays[memlets[-1].data]
        outer.data = propagate_subset(memlets, arr, entry.map.params, entry.map.range, use_dst=use_dst)
        for edge in (*inner, outer):
            edge.data.try_initialize(state.sdfg, state, edge)
    return made
