"""Before autodiff, on the copy of the forward SDFG about to be differentiated."""

from __future__ import annotations

import copy

import dace
from dace.sdfg import nodes


def split_shared_map_inputs(sdfg: dace.SDFG) -> int:
    """Give every reader inside a map its own map-entry connector; returns how many were split.

    gap: simplify merges a map's duplicate inputs (``y * y`` reads ``y`` through one connector), and DaCe's data
    forwarding then adds that connector to the backward map twice and asserts (``assert added``).
    """
    split = 0
    changed = True
    while changed:
        changed = False
        for state in (s for g in sdfg.all_sdfgs_recursive() for s in g.states()):
            for entry in [n for n in state.nodes() if isinstance(n, nodes.MapEntry)]:
                for out_conn in [c for c in entry.out_connectors if c.startswith("OUT_")]:
                    readers = list(state.out_edges_by_connector(entry, out_conn))
                    if len(readers) < 2:
                        continue
                    [feed] = state.in_edges_by_connector(entry, "IN_" + out_conn[4:])
                    for edge in readers[1:]:
                        name = entry.next_connector(out_conn[4:])
                        entry.add_in_connector("IN_" + name)
                        entry.add_out_connector("OUT_" + name)
                        state.add_edge(feed.src, feed.src_conn, entry, "IN_" + name, copy.deepcopy(feed.data))
                        state.add_edge(entry, "OUT_" + name, edge.dst, edge.dst_conn, copy.deepcopy(edge.data))
                        state.remove_edge(edge)
                        split += 1
                    changed = True
    return split
