"""An SDFG -> the plain data the views draw: states, nodes with their scope and details, memlets with volumes, and
what the step that made the SDFG changed.

The views (the widget, the static rendering) read this, never the SDFG itself, so the browser gets a compact,
JSON-serialisable picture. A node's ``label`` is what ``where`` matches (``matching.label``); its ``name`` is the
readable one the views draw (``names``).
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable, Container, Hashable, Iterator
from typing import Any

import dace
from dace import data as dt
from dace.sdfg import nodes

from ..actions.matching import label
from .. import names
from ..diff import ACCESS, LIBRARY, MAP_ENTRY, MAP_EXIT, NESTED, OTHER, TASKLET, Diff, between, kind, placed

#: what a step did to a node of the picture it made
ADDED, CHANGED, GONE = "added", "changed", "gone"
#: above this many nodes a picture opens with its map scopes collapsed: the static SVG (render.py) and the
#: widget's view (it reads the picture's ``collapse_above``) alike
COLLAPSE_ABOVE = 250


def describe(
    sdfg: dace.SDFG | None,
    before: dace.SDFG | None = None,
    metrics: dict[str, dict] | None = None,
    after: dace.SDFG | None = None,
) -> dict[str, Any] | None:
    """The drawable picture of ``sdfg`` (None stays None).

    ``before``: the SDFG of the step this one was made from. The nodes the step added or changed say so in their
    ``change``; the picture's ``removed`` lists the nodes of ``before`` gone from ``sdfg``, nested SDFGs' too, each
    with the id of the state that stands for its own (state ids are unique across a picture and its nested ones).
    ``metrics``: node guid -> numbers measured for it (``{"flops": ..., "ms": ...}``), carried as ``metrics``.
    ``after``: the SDFG of the step made from this one; the nodes that step took away or changed are ``GONE``.
    """
    if sdfg is None:
        return None
    diff = between(before, sdfg) if before is not None else None
    state_ids: dict[dace.SDFGState, str] = {}
    gone = _gone(between(sdfg, after)) if after is not None else set()
    picture = _sdfg(sdfg, "", _Context(diff, metrics or {}, state_ids, gone))
    if diff is not None:
        picture["removed"] = [
            {"state": state_ids.get(state) if state is not None else None, "name": _name(node), "kind": kind(node)}
            for node, state in diff.removed
        ]
    return dict(picture, collapse_above=COLLAPSE_ABOVE)


def size(graph: dict[str, Any] | None) -> int:
    """Nodes in a picture, nested SDFGs included."""
    return 0 if graph is None else len(all_nodes(graph))


def all_nodes(graph: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of a picture, nested SDFGs' included, each before what it holds."""
    found = []
    for state in graph["states"]:
        for node in state["nodes"]:
            found.append(node)
            found.extend(all_nodes(node["sdfg"]) if "sdfg" in node else ())
    return found


class _Context:
    """What describing one SDFG carries down into its nested SDFGs."""

    def __init__(
        self,
        diff: Diff | None,
        metrics: dict[str, dict],
        state_ids: dict[dace.SDFGState, str],
        gone: set[nodes.Node],
    ):
        self.diff = diff
        #: the nodes the next step took away or changed
        self.gone = gone
        self.metrics = metrics
        #: each state drawn -> its id in the picture, which the removed nodes' entries point at
        self.state_ids = state_ids


def _sdfg(sdfg: dace.SDFG, prefix: str, context: _Context) -> dict[str, Any]:
    states = list(sdfg.states())
    index = {state: i for i, state in enumerate(states)}
    context.state_ids.update((state, f"{prefix}s{i}") for i, state in enumerate(states))
    return {
        "name": names.readable_sdfg(sdfg.name),
        "raw": sdfg.name,
        "states": [_state(sdfg, state, f"{prefix}s{i}", context) for i, state in enumerate(states)],
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


def _state(sdfg: dace.SDFG, state: dace.SDFGState, sid: str, context: _Context) -> dict[str, Any]:
    ids = {node: f"{sid}n{i}" for i, node in enumerate(state.nodes())}
    scopes = state.scope_dict()
    result_nodes = []
    for node in state.nodes():
        entry = state.entry_node(node) if isinstance(node, nodes.ExitNode) else scopes.get(node)
        name, raw = _name(node), label(node)
        info = _info(sdfg, node)
        item: dict[str, Any] = {
            "id": ids[node],
            "kind": kind(node),
            "label": raw,
            "name": name,
            "guid": str(node.guid),
            "scope": ids[entry] if entry is not None else None,
            "info": {"DaCe name": raw, **info} if raw != name else info,
        }
        if isinstance(node, nodes.EntryNode):
            item["exit"] = ids[state.exit_node(node)]
        if isinstance(node, nodes.NestedSDFG):
            item["sdfg"] = _sdfg(node.sdfg, f"{ids[node]}.", context)
        if context.diff is not None and (change := _change(context.diff, sdfg, state, node)):
            item["change"] = change
        elif node in context.gone:
            item["change"] = GONE
        if item["guid"] in context.metrics:
            item["metrics"] = dict(context.metrics[item["guid"]])
        result_nodes.append(item)
    edges = []
    for e in state.edges():
        memlet = e.data
        edge: dict[str, Any] = {"src": ids[e.src], "dst": ids[e.dst]}
        if memlet is not None and memlet.data is not None:
            edge["data"] = memlet.data
            edge["subset"] = str(memlet.subset) if memlet.subset is not None else ""
            edge["volume"] = str(memlet.volume) + (" (dynamic)" if memlet.dynamic else "")
            moved = _bytes(sdfg, memlet)
            if moved is not None:
                edge["bytes"] = moved
            if memlet.wcr is not None:
                edge["wcr"] = str(memlet.wcr)
            edge["label"] = f"{names.readable(memlet.data)}[{edge['subset']}]"
        else:
            edge["label"] = ""
        if e.src_conn or e.dst_conn:
            edge["connectors"] = f"{e.src_conn or ''} -> {e.dst_conn or ''}"
        edges.append(edge)
    raw = state.label
    return {"id": sid, "label": names.readable_state(raw), "raw": raw, "nodes": result_nodes, "edges": edges}


def _bytes(sdfg: dace.SDFG, memlet: dace.Memlet) -> int | None:
    """The bytes a memlet moves, where its volume is a number (not dynamic, not symbolic)."""
    desc = sdfg.arrays.get(memlet.data)
    if memlet.dynamic or desc is None:
        return None
    try:
        return int(memlet.volume) * desc.dtype.bytes
    except (TypeError, ValueError):  # symbolic volumes
        return None


def names_by_guid(sdfg: dace.SDFG) -> dict[str, str]:
    """Node guid -> the name a picture of ``sdfg`` draws the node with (without drawing it)."""
    return {str(node.guid): _name(node) for node, _, _ in placed(sdfg)}


def _name(node: nodes.Node) -> str:
    """The readable name a view draws for a node."""
    if isinstance(node, (nodes.MapEntry, nodes.MapExit)):
        return names.readable_map(node.map.label)
    if isinstance(node, nodes.NestedSDFG):  # its SDFG's name says where it came from: "(expansion)", "(backward)"
        return names.readable_sdfg(node.sdfg.name)
    return names.readable(label(node))



def range_text(ranges) -> str:
    """A map's range as begin:end(:step) per dimension, end exclusive. DaCe prints a dimension of one iteration with
    a step as ``begin:step`` (a row of 16 vectorized 16 wide: ``0:16``, as if it had not changed)."""
    parts = []
    for begin, end, step in ranges:
        text = str(begin) if begin == end and step == 1 else f"{begin}:{end + 1}"
        parts.append(text if step == 1 else f"{text}:{step}")
    return ", ".join(parts)


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
            "range": range_text(m.range),
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


# --- what a step changed --------------------------------------------------------------------------------------


def _change(diff: Diff, sdfg: dace.SDFG, state: dace.SDFGState, node: nodes.Node) -> str | None:
    """``ADDED``, ``CHANGED`` (its details or, for a map, what its scope holds), or None."""
    old = diff.match.get(node)
    if old is None:
        return ADDED
    _, old_state, old_sdfg = diff.placed_before(old)
    return CHANGED if _fingerprint(old_sdfg, old_state, old) != _fingerprint(sdfg, state, node) else None


def _gone(diff: Diff) -> set[nodes.Node]:
    """The nodes of ``diff``'s earlier SDFG that the later one lacks or changed."""
    gone = {node for node, _ in diff.removed}
    for new, old in diff.match.items():
        _, old_state, old_sdfg = diff.placed_before(old)
        _, new_state, new_sdfg = diff.placed_after(new)
        if _fingerprint(old_sdfg, old_state, old) != _fingerprint(new_sdfg, new_state, new):
            gone.add(old)
    return gone


def _fingerprint(sdfg: dace.SDFG, state: dace.SDFGState, node: nodes.Node) -> Hashable:
    """What makes a node the same as before: its details, and for a map what its scope holds."""
    info = tuple(_info(sdfg, node).items())
    if not isinstance(node, nodes.EntryNode):
        return info
    held = sorted((kind(n), label(n)) for n, scope in state.scope_dict().items() if scope is node)
    return info, tuple(held)
