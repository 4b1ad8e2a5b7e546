"""An SDFG -> the plain data the views draw: states, nodes with their scope and details, memlets with volumes.

The views (the widget, the static rendering) read this, never the SDFG itself, so the browser gets a compact,
JSON-serialisable picture with the same labels that ``where`` matches (``matching.label``).
"""

from __future__ import annotations

from typing import Any

import dace
from dace import data as dt
from dace.sdfg import nodes

from .matching import label

#: node kinds, in SDFV's vocabulary
ACCESS, MAP_ENTRY, MAP_EXIT, TASKLET, LIBRARY, NESTED, OTHER = (
    "access",
    "map_entry",
    "map_exit",
    "tasklet",
    "library",
    "nested",
    "other",
)
#: above this many nodes a picture opens with its map scopes collapsed: the static SVG (render.py) and the
#: widget's view (it reads the picture's ``collapse_above``) alike
COLLAPSE_ABOVE = 250


def describe(sdfg: dace.SDFG | None) -> dict[str, Any] | None:
    """The drawable picture of ``sdfg`` (None stays None)."""
    if sdfg is None:
        return None
    return dict(_sdfg(sdfg, prefix=""), collapse_above=COLLAPSE_ABOVE)


def size(graph: dict[str, Any] | None) -> int:
    """Nodes in a picture, nested SDFGs included."""
    if graph is None:
        return 0
    total = 0
    for state in graph["states"]:
        for node in state["nodes"]:
            total += 1 + size(node.get("sdfg"))
    return total


def _sdfg(sdfg: dace.SDFG, prefix: str) -> dict[str, Any]:
    states = list(sdfg.states())
    index = {state: i for i, state in enumerate(states)}
    return {
        "name": sdfg.name,
        "states": [_state(sdfg, state, f"{prefix}s{i}") for i, state in enumerate(states)],
        "interstate": [
            {
                "src": f"{prefix}s{index[e.src]}",
                "dst": f"{prefix}s{index[e.dst]}",
                "label": _interstate_label(e.data),
            }
            for e in sdfg.all_interstate_edges()
            if e.src in index and e.dst in index
        ],
    }


def _interstate_label(edge: dace.InterstateEdge) -> str:
    parts = []
    if not edge.is_unconditional():
        parts.append(f"if {edge.condition.as_string}")
    parts.extend(f"{k} = {v}" for k, v in edge.assignments.items())
    return "; ".join(parts)


def _state(sdfg: dace.SDFG, state: dace.SDFGState, sid: str) -> dict[str, Any]:
    ids = {node: f"{sid}n{i}" for i, node in enumerate(state.nodes())}
    scopes = state.scope_dict()
    result_nodes = []
    for node in state.nodes():
        entry = state.entry_node(node) if isinstance(node, nodes.ExitNode) else scopes.get(node)
        item: dict[str, Any] = {
            "id": ids[node],
            "kind": _kind(node),
            "label": label(node),
            "scope": ids[entry] if entry is not None else None,
            "info": _info(sdfg, node),
        }
        if isinstance(node, nodes.EntryNode):
            item["exit"] = ids[state.exit_node(node)]
        if isinstance(node, nodes.NestedSDFG):
            item["sdfg"] = _sdfg(node.sdfg, prefix=f"{ids[node]}.")
        result_nodes.append(item)
    edges = []
    for e in state.edges():
        memlet = e.data
        edge: dict[str, Any] = {"src": ids[e.src], "dst": ids[e.dst]}
        if memlet is not None and memlet.data is not None:
            edge["data"] = memlet.data
            edge["subset"] = str(memlet.subset) if memlet.subset is not None else ""
            edge["volume"] = str(memlet.volume) + (" (dynamic)" if memlet.dynamic else "")
            if memlet.wcr is not None:
                edge["wcr"] = str(memlet.wcr)
            edge["label"] = f"{memlet.data}[{edge['subset']}]"
        else:
            edge["label"] = ""
        if e.src_conn or e.dst_conn:
            edge["connectors"] = f"{e.src_conn or ''} -> {e.dst_conn or ''}"
        edges.append(edge)
    return {"id": sid, "label": state.label, "nodes": result_nodes, "edges": edges}


def _kind(node: nodes.Node) -> str:
    if isinstance(node, nodes.AccessNode):
        return ACCESS
    if isinstance(node, nodes.EntryNode):
        return MAP_ENTRY
    if isinstance(node, nodes.ExitNode):
        return MAP_EXIT
    if isinstance(node, nodes.Tasklet):
        return TASKLET
    if isinstance(node, nodes.LibraryNode):
        return LIBRARY
    if isinstance(node, nodes.NestedSDFG):
        return NESTED
    return OTHER


def _info(sdfg: dace.SDFG, node: nodes.Node) -> dict[str, str]:
    """What a click on the node shows, as label -> text."""
    if isinstance(node, nodes.AccessNode):
        desc = sdfg.arrays.get(node.data)
        if desc is None:
            return {"data": node.data}
        info = {
            "data": node.data,
            "type": type(desc).__name__,
            "shape": " x ".join(str(s) for s in desc.shape),
            "dtype": str(desc.dtype.to_string() if hasattr(desc.dtype, "to_string") else desc.dtype),
            "storage": desc.storage.name,
            "transient": "yes" if desc.transient else "no",
        }
        if not isinstance(desc, dt.View):
            try:
                info["bytes"] = str(int(desc.total_size) * desc.dtype.bytes)
            except (TypeError, ValueError):  # symbolic sizes
                info["bytes"] = f"{desc.total_size} x {desc.dtype.bytes}"
        return info
    if isinstance(node, (nodes.MapEntry, nodes.MapExit)):
        m = node.map
        return {
            "map": m.label,
            "parameters": ", ".join(m.params),
            "range": str(m.range),
            "schedule": m.schedule.name,
        }
    if isinstance(node, nodes.EntryNode):
        return {"scope": str(node)}
    if isinstance(node, nodes.Tasklet):
        return {
            "tasklet": node.label,
            "language": node.language.name,
            "inputs": ", ".join(sorted(node.in_connectors)),
            "outputs": ", ".join(sorted(node.out_connectors)),
            "code": node.code.as_string,
        }
    if isinstance(node, nodes.LibraryNode):
        info = {"library node": node.label, "class": type(node).__name__}
        implementation = getattr(node, "implementation", None)
        if implementation:
            info["implementation"] = str(implementation)
        return info
    if isinstance(node, nodes.NestedSDFG):
        return {
            "nested SDFG": node.sdfg.name,
            "inputs": ", ".join(sorted(node.in_connectors)),
            "outputs": ", ".join(sorted(node.out_connectors)),
        }
    return {"node": str(node)}
