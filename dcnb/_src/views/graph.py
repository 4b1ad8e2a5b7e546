"""An SDFG -> the plain data the views draw: states, nodes with their scope and details, memlets with volumes, and
what the step that made the SDFG changed.

The views (the widget, the static rendering) read this, never the SDFG itself, so the browser gets a compact,
JSON-serialisable picture. A node's ``label`` is what ``where`` matches (``matching.label``); its ``name`` is the
readable one the views draw (``names``, and ``named`` for what an expansion or a transformation made: those carry
names that say nothing of the module, ``_Add_``, ``einsum_gemmgemm``, ``reduce``, and are named after the op whose
arrays they write or, in a backward SDFG, whose gradients they read).
"""

from __future__ import annotations

import collections
import re
import weakref
from collections.abc import Callable, Container, Hashable, Iterator
from typing import Any, NamedTuple

import dace
from dace import data as dt
from dace.sdfg import nodes
from dace.sdfg.utils import dfs_topological_sort

from ..actions.matching import label
from .. import names
from ..diff import ACCESS, LIBRARY, MAP_ENTRY, MAP_EXIT, NESTED, OTHER, TASKLET, Diff, kind

#: what a step did to a node of the picture it made
ADDED, CHANGED, GONE = "added", "changed", "gone"
#: above this many nodes a picture opens with its map scopes collapsed: the static SVG (render.py) and the
#: widget's view (it reads the picture's ``collapse_above``) alike
COLLAPSE_ABOVE = 250


def describe(
    sdfg: dace.SDFG | None,
    before: dace.SDFG | Diff | None = None,
    metrics: dict[str, dict] | None = None,
    after: Diff | None = None,
) -> dict[str, Any] | None:
    """The drawable picture of ``sdfg`` (None stays None).

    ``before``: the SDFG of the step this one was made from, or their ``Diff`` where it was worked out already
    (``step_diffs``). The nodes the step added or changed say so in their ``change``; the picture's ``removed``
    lists the nodes of ``before`` gone from ``sdfg``, nested SDFGs' too, each with the id of the state that stands
    for its own (state ids are unique across a picture and its nested ones).
    ``metrics``: node guid -> numbers measured for it (``{"flops": ..., "ms": ...}``), carried as ``metrics``.
    ``after``: the ``Diff`` of ``sdfg`` and the SDFG of the step made from it; the nodes that step took away or
    changed are ``GONE``.
    """
    if sdfg is None:
        return None
    diff = Diff(before, sdfg) if isinstance(before, dace.SDFG) else before
    state_ids: dict[dace.SDFGState, str] = {}
    gone = _gone(after) if after is not None else set()
    context = _Context(diff, metrics or {}, state_ids, gone, named(sdfg), _root(sdfg))
    picture = _sdfg(sdfg, "", context, names.readable_sdfg(sdfg.name))
    if diff is not None:
        was = named(diff.before) if diff.removed else {}
        picture["removed"] = [
            {"state": state_ids.get(state) if state is not None else None, "name": was[node].name, "kind": kind(node)}
            for node, state in diff.removed
        ]
    return dict(picture, collapse_above=COLLAPSE_ABOVE)


def step_diffs(session: Any, index: int | None = None) -> tuple[Diff | None, Diff | None]:
    """What good step ``index`` (the current one by default) changed in its forward and backward SDFGs against the
    step it was made from (None: the naive step, or no backward). Worked out once per step and kept in its
    analysis: the widget's pictures of the step and of the one before it, and the static rendering, read the same."""

    previous = session.previous_step(index)
    if previous is None:
        return None, None

    def worked_out() -> tuple[Diff | None, Diff | None]:
        pairs = zip(session.compiled_sdfgs(previous), session.compiled_sdfgs(index), strict=True)
        return tuple(None if old is None or new is None else Diff(old, new) for old, new in pairs)

    return session.analysis(index).result("diffs", worked_out)


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
        named: dict[nodes.Node, Named],
        root: str,
    ):
        self.diff = diff
        self.named = named
        #: the class of the module, which names its own ops
        self.root = root
        #: the nodes the next step took away or changed
        self.gone = gone
        self.metrics = metrics
        #: each state drawn -> its id in the picture, which the removed nodes' entries point at
        self.state_ids = state_ids


def _sdfg(sdfg: dace.SDFG, prefix: str, context: _Context, name: str) -> dict[str, Any]:
    states = list(sdfg.states())
    index = {state: i for i, state in enumerate(states)}
    context.state_ids.update((state, f"{prefix}s{i}") for i, state in enumerate(states))
    return {
        "name": name,
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
        name, raw = context.named[node].name, label(node)
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
            item["sdfg"] = _sdfg(node.sdfg, f"{ids[node]}.", context, name)
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
            edge["label"] = f"{names.readable(memlet.data, context.root)}[{edge['subset']}]"
        else:
            edge["label"] = ""
        if e.src_conn or e.dst_conn:
            edge["connectors"] = f"{e.src_conn or ''} -> {e.dst_conn or ''}"
        edges.append(edge)
    name = _state_name(sdfg, state, context.root)
    return {"id": sid, "label": name, "raw": state.label, "nodes": result_nodes, "edges": edges}


def _bytes(sdfg: dace.SDFG, memlet: dace.Memlet) -> int | None:
    """The bytes a memlet moves, where its volume is a number (not dynamic, not symbolic)."""
    desc = sdfg.arrays.get(memlet.data)
    if memlet.dynamic or desc is None:
        return None
    try:
        return int(memlet.volume) * desc.dtype.bytes
    except (TypeError, ValueError):  # symbolic volumes
        return None


# --- names ----------------------------------------------------------------------------------------------------


class Named(NamedTuple):
    """How the pictures name a node: ``name``, what they draw; ``op``, the op it computes (a part of), or the ops
    (``a ∘ b``) of a map that fusion gave several, which the profile sums its kernels by: its name where the node is
    no op's."""

    name: str
    op: str


def named_by_guid(sdfg: dace.SDFG) -> dict[str, Named]:
    """Node guid -> how a picture of ``sdfg`` names the node (without drawing it)."""
    return {str(node.guid): how for node, how in named(sdfg).items()}


def named(sdfg: dace.SDFG) -> dict[nodes.Node, Named]:
    """Every node of ``sdfg``, nested SDFGs' included -> how the pictures name it.

    A node whose label names something of the module reads as ``names`` reads the label. The others (``generic``)
    are what an expansion, autodiff or a transformation made. Such a tasklet, library node or nested SDFG is named
    after the op of what it computes: the op of the arrays it writes or, nearest, of those it goes on to write;
    else (backward) the op whose gradient it reads, or nearest upstream, marked ``(backward)``; else the op of the
    node it feeds, else the op of the nested SDFG it is in. Its own name follows after ``›`` where that says more
    than the op's kind (``norm1 · LayerNormalization › reduce``, but ``fc1 · Add``). A map is named after the ops of
    what it holds, in the order they run; a transient array of a name of its own (``mean``) after the op of what
    writes it."""
    found: dict[nodes.Node, Named] = {}
    _name_sdfg(sdfg, _root(sdfg), found)
    return found


def _root(sdfg: dace.SDFG) -> str:
    """The class of the module ``sdfg`` (or the SDFG it is nested in) is of, which names the module's own ops."""
    return names.module_class(sdfg.root_sdfg.name)


def _name_sdfg(sdfg: dace.SDFG, root: str, found: dict[nodes.Node, Named], op: str | None = None) -> None:
    """Name the nodes of ``sdfg``, nested in a node of ``op`` (the op what nothing else names is of)."""
    for state in sdfg.states():
        named_here, of_ops = _name_state(state, root, op)
        found.update(named_here)
        for node in state.nodes():
            if isinstance(node, nodes.NestedSDFG):
                _name_sdfg(node.sdfg, root, found, found[node].op if node in of_ops else None)


#: the nodes that compute (a map's entry and exit stand for what they hold)
_LEAVES = (nodes.Tasklet, nodes.LibraryNode, nodes.NestedSDFG)


def _name_state(
    state: dace.SDFGState, root: str, within: str | None
) -> tuple[dict[nodes.Node, Named], set[nodes.Node]]:
    """How the nodes of ``state`` are named, and the leaves of them named after an op; ``within``: the op of the
    nested SDFG the state is in."""
    order = list(dfs_topological_sort(state))
    # the op whose results a node goes on to write, forward (the nearest), and whose gradient it reads, backward
    down: dict[nodes.Node, str | None] = {}
    for node in reversed(order):
        down[node] = _op(node.data, root, backward=False) if isinstance(node, nodes.AccessNode) else None
        down[node] = down[node] or _written_op(state, node, root)
        down[node] = down[node] or next((down[e.dst] for e in state.out_edges(node) if down[e.dst]), None)
    up: dict[nodes.Node, str | None] = {}
    for node in order:
        up[node] = _op(node.data, root, backward=True) if isinstance(node, nodes.AccessNode) else None
        up[node] = up[node] or _read_gradient_op(state, node, root)
        up[node] = up[node] or next((up[e.src] for e in state.in_edges(node) if up[e.src]), None)
    # a leaf whose own name names no op -> its op, ``(backward)`` marked
    derived: dict[nodes.Node, str] = {}
    leaves = [node for node in order if isinstance(node, _LEAVES) and _generic(node)]
    for node in leaves:
        if down[node]:
            derived[node] = down[node]
        elif up[node]:
            derived[node] = f"{up[node]} (backward)"
    # what feeds such a leaf and computes nothing of an op (a constant a backward rule makes, a buffer zeroed for
    # it) is of the leaf's op
    later: dict[nodes.Node, str | None] = {}
    for node in reversed(order):
        later[node] = derived.get(node) or next((later[e.dst] for e in state.out_edges(node) if later[e.dst]), None)
    derived.update((node, op) for node in leaves if node not in derived and (op := later[node] or within))
    found: dict[nodes.Node, Named] = {}
    for node in order:
        own = _own_name(node, root)
        found[node] = _after_op(derived[node], own) if node in derived else Named(own, own)
    of_ops = {node for node in order if isinstance(node, _LEAVES) and (node in derived or not _generic(node))}
    scopes = state.scope_dict()
    held: dict[nodes.Node, list[str]] = collections.defaultdict(list)
    for node in order:
        if node in of_ops:
            scope = scopes[node]
            while scope is not None:
                held[scope].append(found[node].op)
                scope = scopes[scope]
    # an array -> the op of what writes it (through the views of it)
    written: dict[nodes.Node, str] = {}
    for node in order:
        if isinstance(node, nodes.EntryNode) and held[node]:
            name = _chain(list(dict.fromkeys(held[node])))
            found[node] = found[state.exit_node(node)] = Named(name, name)
        elif isinstance(node, nodes.AccessNode):
            writers = [state.memlet_path(e)[0].src for e in state.in_edges(node)]
            if not (op := next((op for w in writers if (op := derived.get(w) or written.get(w))), None)):
                continue
            written[node] = op
            if state.sdfg.arrays[node.data].transient and names.generic(node.data):
                found[node] = Named(f"{op} › {found[node].name}", op)
    return found, of_ops


def _own_name(node: nodes.Node, root: str) -> str:
    """What a node's own label reads."""
    if isinstance(node, (nodes.MapEntry, nodes.MapExit)):
        return names.readable_map(node.map.label, root)
    if isinstance(node, nodes.NestedSDFG) and (not names.generic(node.sdfg.name) or names.generic(node.label)):
        # its SDFG's name says where it came from: "(expansion)", "(backward)"
        return names.readable_sdfg(node.sdfg.name, root)
    return names.readable(label(node), root)


def _generic(node: nodes.Node) -> bool:
    """Whether a node's label (and a nested SDFG's name) says nothing of the module."""
    if isinstance(node, nodes.NestedSDFG):
        return names.generic(node.sdfg.name) and names.generic(node.label)
    return names.generic(label(node))


def _op(data: str | None, root: str, backward: bool) -> str | None:
    """The op an array is of, where it is of the op's forward (or, ``backward``, of its backward)."""
    found = names.origin(data, root) if data is not None else None
    return found.op if found is not None and found.backward == backward else None


def _written_op(state: dace.SDFGState, node: nodes.Node, root: str) -> str | None:
    """The op of the first array ``node`` writes that an op's forward made."""
    if isinstance(node, (nodes.AccessNode, nodes.EntryNode)):  # (what leaves these is read)
        return None
    return next((op for e in state.out_edges(node) if (op := _op(e.data.data, root, backward=False))), None)


def _read_gradient_op(state: dace.SDFGState, node: nodes.Node, root: str) -> str | None:
    """The op of the first gradient ``node`` reads (a reversed node reads its forward one's output gradient)."""
    if isinstance(node, (nodes.AccessNode, nodes.ExitNode)):  # (what enters these is written)
        return None
    return next((op for e in state.in_edges(node) if (op := _op(e.data.data, root, backward=True))), None)


def _after_op(op: str, own: str) -> Named:
    """A node named after ``op``, and its own name after it where that says more than the op's kind (a tasklet
    fusion made says which pieces it fused: the op is only the last one's)."""
    inner = own.removesuffix(" (backward)")
    kind = re.sub(r"_\d+$", "", op.removesuffix(" (backward)").rpartition(" · ")[2]).lower()
    word = inner.replace("_", "").lower()
    same = " ∘ " not in inner and (kind in word or word in kind)
    return Named(op if same else f"{op} › {inner}", op)


def _chain(ops: list[str]) -> str:
    """Ops in the order they run, ``∘``-joined; a module path said once for a run of ops of that module."""
    text, module = [], None
    for op in ops:
        path, dot, rest = op.rpartition(" · ")
        text.append(rest if dot and path == module else op)
        module = path if dot and " " not in path else None
    return " ∘ ".join(text)


def _state_name(sdfg: dace.SDFG, state: dace.SDFGState, root: str) -> str:
    """A state's label read, as a backward SDFG's (its own or a backward rule's) where DaCe made the label up."""
    return names.readable_state(
        state.label,
        root,
        backward=names.readable_sdfg(sdfg.name).endswith("backward)"),
        computes=any(not isinstance(n, nodes.AccessNode) for n in state.nodes()),
    )



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
