"""Every use dcnb makes of DaCe's internals: private attributes and behaviour DaCe does not document. Each says why
it is needed and was checked against DaCe ``CHECKED_WITH``; after an upgrade of DaCe, this is the file to read.

DaCe's public API (SDFG, nodes, transformations, the ONNX and autodiff registries) is used where it is needed.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import inspect
import sys
from collections.abc import Callable, Iterator

import dace
import dace.sdfg.state
from dace.codegen.compiled_sdfg import CompiledSDFG
from dace.sdfg.graph import Graph, OrderedDiGraph
from dace.sdfg.state import SDFGState
from dace.transformation import PatternTransformation
from dace.transformation.passes import simplify as simplify_passes
from dace.transformation.subgraph import CompositeFusion, SubgraphFusion

CHECKED_WITH = "2.0.0b1"


# --- pattern matches ------------------------------------------------------------------------------------------


def match_sdfg(match: PatternTransformation) -> dace.SDFG:
    """The SDFG a match was found in: a match keeps it only as ``_sdfg`` (its public ``cfg_id`` indexes into it)."""
    return match._sdfg


def match_state(match: PatternTransformation) -> dace.SDFGState:
    """The state a match was found in, as ``PatternTransformation.apply_pattern`` looks it up."""
    return match_sdfg(match).cfg_list[match.cfg_id].node(match.state_id)


def pattern_nodes(match: PatternTransformation) -> list:
    """The nodes a match binds: its pattern's node names are listed only by the private ``_get_pattern_nodes``."""
    return [getattr(match, name) for name in type(match)._get_pattern_nodes()]


def bound_nodes(match: PatternTransformation) -> dict:
    """The nodes a match binds, by the pattern nodes of the expression it matched (kept only as ``_subgraph_user``)."""
    state = match_state(match)
    return {pattern: state.node(i) for pattern, i in match._subgraph_user.items()}


def fused_entry(fusion: CompositeFusion) -> dace.nodes.MapEntry:
    """The map an applied CompositeFusion made: kept only as ``_global_map_entry`` (DaCe's greedy_fuse reads it so)."""
    return fusion._global_map_entry


# --- replaced functions ---------------------------------------------------------------------------------------


def replace_topo_feasibility(check: Callable[..., bool]) -> None:
    """Put ``check`` in place of ``SubgraphFusion.check_topo_feasibility``: its callers (SubgraphFusion's
    ``can_be_applied``, which CompositeFusion and greedy fusion reach, and StencilTiling's) call it through the class,
    so no subclass or registration can stand in for it."""
    SubgraphFusion.check_topo_feasibility = staticmethod(check)


def replace_debug_info() -> None:
    """Find the line that adds a node to a state from its frame alone, where DaCe (``compiler.lineinfo`` "inspect",
    its default) builds ``inspect.stack()``: every frame of the stack, each with its source file searched and its line
    read, for each node, memlet path or map added. The same DebugInfo (the caller's line and file, as
    ``inspect.getframeinfo`` gives them); every other case is DaCe's own ``_get_debug_info``. Every ``SDFGState.add_*``
    calls it by the name in its module, so the replacement is that name.

    gap: DaCe's line information costs a walk of the whole Python stack per node added, in every SDFG built
    (expansions, autodiff, passes): 1.4 s of a ResNet-50's autodiff, and more the deeper the stack it is called from.
    """
    original = dace.sdfg.state._get_debug_info
    if getattr(original, "from_the_frame", False):
        return

    def from_the_frame(explicit: dace.dtypes.DebugInfo | None) -> dace.dtypes.DebugInfo | None:
        if explicit is not None or dace.Config.get("compiler", "lineinfo") != "inspect":
            return original(explicit)
        # DaCe's inspect.stack()[2]: this function, the SDFGState method, then the line that called that
        caller = inspect.getframeinfo(sys._getframe(2), context=0)
        return dace.dtypes.DebugInfo(caller.lineno, 0, caller.lineno, 0, caller.filename)

    from_the_frame.from_the_frame = True
    dace.sdfg.state._get_debug_info = from_the_frame


def replace_has_cycles() -> None:
    """Put :func:`has_cycles` in place of ``OrderedDiGraph.has_cycles`` (an SDFG state's, a control-flow region's),
    which validation calls on every state; DaCe's own stays reachable as ``has_cycles.dace``."""
    if OrderedDiGraph.has_cycles is not has_cycles:
        has_cycles.dace = OrderedDiGraph.has_cycles
        OrderedDiGraph.has_cycles = has_cycles


def has_cycles(graph: OrderedDiGraph) -> bool:
    """Whether a cycle can be reached from the graph's source nodes (from any node where it has none): DaCe's answer,
    by removing nodes in topological order from the part reached (Kahn's algorithm), each edge followed twice.

    gap: DaCe asks networkx's ``find_cycle`` with every source node as a start: it walks everything below each start
    again, so a state whose parameters are its hundreds of source nodes was walked once per parameter (24 s of
    EfficientNet-B0's import, in the validation of its forward state).
    """
    starts = graph.source_nodes() or list(graph.nodes())
    reached, stack = set(starts), list(starts)
    while stack:
        for edge in graph.out_edges(stack.pop()):
            if edge.dst not in reached:
                reached.add(edge.dst)
                stack.append(edge.dst)
    waiting = {node: sum(edge.src in reached for edge in graph.in_edges(node)) for node in reached}
    ready = [node for node, count in waiting.items() if count == 0]
    removed = 0
    while ready:
        removed += 1
        for edge in graph.out_edges(ready.pop()):
            waiting[edge.dst] -= 1
            if waiting[edge.dst] == 0:
                ready.append(edge.dst)
    return removed < len(reached)


def replace_state_queries() -> None:
    """Keep a state's sink nodes and its nodes' indices (``SDFGState.sink_nodes``, ``SDFGState.node_id``) until the
    state changes: dropped wherever DaCe drops the scopes it keeps (``_clear_scopedict_cache``, which every
    ``SDFGState`` method adding or removing a node or an edge calls) and when the state is reversed. The same answers,
    from DaCe's own functions; a state's nodes are compared by identity, as ``node_id`` compares them.

    gap: DaCe's code generation asks for the whole list of a state's sink nodes once per access node it generates
    (``_generate_AccessNode``) and finds a node's index by walking the state's nodes, once per line of code it writes
    and per node of each subgraph view it sorts: both grew with the square of the state (30 of the 110 s that
    generating EfficientNet-B0's backward took, profiled).
    """
    if getattr(SDFGState.sink_nodes, "kept", False):
        return
    clear, reverse, find = SDFGState._clear_scopedict_cache, SDFGState.reverse, OrderedDiGraph.node_id

    def cleared(state: SDFGState) -> None:
        clear(state)
        state.__dict__.pop("_dcnb_sinks", None)
        state.__dict__.pop("_dcnb_indices", None)

    def reversed_(state: SDFGState) -> None:
        cleared(state)
        reverse(state)

    def sink_nodes(state: SDFGState) -> list:
        sinks = state.__dict__.get("_dcnb_sinks")
        if sinks is None:
            sinks = state.__dict__["_dcnb_sinks"] = Graph.sink_nodes(state)
        return list(sinks)

    def node_id(state: SDFGState, node) -> int:
        indices = state.__dict__.get("_dcnb_indices")
        if indices is None:
            indices = state.__dict__["_dcnb_indices"] = {n: i for i, n in enumerate(state.nodes())}
        found = indices.get(node)
        return find(state, node) if found is None else found  # (DaCe's raises NodeNotFoundError)

    sink_nodes.kept = True
    SDFGState._clear_scopedict_cache = cleared
    SDFGState.reverse = reversed_
    SDFGState.sink_nodes = sink_nodes
    SDFGState.node_id = node_id


def replace_scope_children() -> None:
    """Work out a state's scope children (``SDFGState.scope_children``: each scope's nodes, the top level's under
    None) from its scope dictionary, whose walk visits the nodes in the order DaCe's walk for the children does: the
    same lists in the same order, cached and copied as DaCe's are; its ``return_ids`` and ``validate`` as there.
    DaCe's own stays reachable as ``SDFGState.scope_children.dace``.

    gap: DaCe walks the whole state again for the children, after the walk for the scope dictionary, and a change to
    the state drops both: every map fusion of auto_optimize made the next test walk a 12-layer BERT's backward twice
    (4,600 nodes; 34 of the 72 s its walks took, profiled)."""
    if getattr(SDFGState.scope_children, "from_the_parents", False):
        return
    from dace.sdfg.scope import _scope_dict_to_ids

    def scope_children(state: SDFGState, return_ids: bool = False, validate: bool = True) -> dict:
        children = state._scope_dict_tochildren_cached
        if children is None:
            children = {None: []}
            for node, parent in state.scope_dict(validate=validate).items():
                children.setdefault(parent, []).append(node)
                if isinstance(node, dace.nodes.EntryNode):
                    children.setdefault(node, [])
            state._scope_dict_tochildren_cached = children
        children = copy.copy(children)
        return _scope_dict_to_ids(state, children) if return_ids else children

    scope_children.from_the_parents = True
    scope_children.dace = SDFGState.scope_children
    SDFGState.scope_children = scope_children


def replace_sdfg_symbols() -> None:
    """Work out the symbols of an SDFG's arrays (``SDFGState.sdfg_symbols``: its own symbols, then each array's free
    symbols) with each array's kept while its shape, strides, offset and total size are the objects they were: DaCe
    sets them whole (the property setters, ``set_shape``), never in place. The same symbols, in the same order;
    arrays of other kinds (structures, references' sets) are asked each time, as DaCe asks them.

    gap: DaCe works the arrays' symbols out again for every symbol lookup it makes (a fresh ``SymbolResolver`` per
    nested SDFG added, per memlet scope propagated): 4,752 walks of over 1,100 arrays, 10.6 of auto_optimize's 142 s
    on a 12-layer BERT's backward."""
    if getattr(SDFGState.sdfg_symbols, "kept", False):
        return

    def sdfg_symbols(state: SDFGState) -> dict:
        sdfg = state.sdfg
        symbols = collections.OrderedDict(sdfg.symbols)
        for desc in sdfg.arrays.values():
            for symbol in _array_symbols(desc):
                symbols.setdefault(symbol.name, symbol.dtype)
        return symbols

    sdfg_symbols.kept = True
    SDFGState.sdfg_symbols = sdfg_symbols


def replace_used_arrays() -> None:
    """Let an SDFG's free symbols (``SDFG._used_symbols_internal``) find the arrays it reads or writes by their names
    alone: the arrays of access nodes with an edge that carries data, those that interstate edges and the conditions
    of its control-flow regions name, as ``SDFG.read_and_write_sets`` finds them; each memlet of its states is
    initialized on the way (``Memlet.try_initialize``), as that walk does first. The same arrays, so the same symbols.

    gap: the free symbols take only the names of what ``read_and_write_sets`` returns, which works out every subset
    read and written and the state's concurrent subgraphs for them: 12,157 such walks, 17 of the 109 s profiled of
    generating the code of a 12-layer BERT's backward (free symbols are asked per nested SDFG, per state, per scope),
    and most of loading a binary (``CompiledSDFG`` asks for the argument list)."""
    original = dace.SDFG._used_symbols_internal
    if getattr(original, "names_only", False):
        return

    @functools.wraps(original)
    def used_symbols_internal(sdfg: dace.SDFG, *args, **kwargs):
        if "read_and_write_sets" in vars(sdfg):  # (asked again within: the names are already there)
            return original(sdfg, *args, **kwargs)
        sdfg.read_and_write_sets = lambda: (_accessed(sdfg), set())
        try:
            return original(sdfg, *args, **kwargs)
        finally:
            del sdfg.read_and_write_sets

    used_symbols_internal.names_only = True
    dace.SDFG._used_symbols_internal = used_symbols_internal


def _accessed(sdfg: dace.SDFG) -> set[str]:
    """The names of the arrays ``sdfg`` reads or writes: the union of ``read_and_write_sets``' two sets."""
    names = set()
    for state in sdfg.states():
        for edge in state.edges():
            edge.data.try_initialize(sdfg, state, edge)
            if not edge.data.is_empty():
                names.update(n.data for n in (edge.src, edge.dst) if isinstance(n, dace.nodes.AccessNode))
    arrays = sdfg.arrays.keys()
    for edge in sdfg.all_interstate_edges():
        names |= edge.data.free_symbols & arrays
    for region in sdfg.all_control_flow_regions():
        names |= region.used_symbols(all_symbols=True, with_contents=False) & arrays
    return names


#: the array kinds whose free symbols are those of their shape, strides, offset and total size (``Array.used_symbols``)
_SHAPED = (dace.data.Array.used_symbols, dace.data.Data.used_symbols)
#: the attributes DaCe's properties keep those four parts in
_PARTS = ("_shape", "_strides", "_offset", "_total_size")
#: per kind of array: whether its symbols are those of the four parts, each a property read from its attribute
_PLAIN: dict[type, bool] = {}


def _plain(kind: type) -> bool:
    plain = _PLAIN.get(kind)
    if plain is None:
        parts = [inspect.getattr_static(kind, name[1:], None) for name in _PARTS]
        plain = _PLAIN[kind] = kind.used_symbols in _SHAPED and all(
            isinstance(p, dace.properties.Property) and p.getter is None and p.private_name == name
            for p, name in zip(parts, _PARTS)
        )
    return plain


def _array_symbols(desc: dace.data.Data) -> set:
    # the parts read from the instance's attributes, not through the properties: 4 of the 7 s that 4,752 walks of
    # 1,100 arrays took in auto_optimize on a 12-layer BERT's backward
    held = desc.__dict__
    kept = held.get("_dcnb_symbols")
    if kept is not None:
        parts = kept[0]
        if (
            held.get("_shape") is parts[0]
            and held.get("_strides") is parts[1]
            and held.get("_offset") is parts[2]
            and held.get("_total_size") is parts[3]
        ):
            return kept[1]
    elif not _plain(type(desc)):
        return desc.free_symbols
    found = desc.free_symbols
    held["_dcnb_symbols"] = (tuple(held.get(name) for name in _PARTS), found)  # the parts held: their ids stay theirs
    return found


def replace_nested_sdfg_symbols() -> None:
    """Add a nested SDFG (``SDFGState.add_nested_sdfg``) without working out the symbols its parent defines where the
    nested SDFG already declares every symbol its node maps: DaCe's method works them out first and reads them only
    to type a symbol the nested SDFG lacks. The nested SDFG's free symbols are worked out once for the call. The
    same node, mapping and symbols.

    gap: the lookup walks every array of the parent SDFG (``defined_symbols``), once per library node expanded:
    8.5 of auto_optimize's 142 s on a 12-layer BERT's backward, 1,212 expansions into an SDFG of over 1,100 arrays.
    """
    original = SDFGState.add_nested_sdfg
    if getattr(original, "looked_up_when_read", False):
        return
    parameters = inspect.signature(original)

    def add_nested_sdfg(state: SDFGState, *args, **kwargs):
        bound = parameters.bind(state, *args, **kwargs).arguments
        sdfg, mapping = bound.get("sdfg"), bound.get("symbol_mapping") or {}
        if sdfg is None:
            return original(state, *args, **kwargs)
        free = sdfg.free_symbols
        # DaCe's method asks for the same free symbols again (``used_symbols(all_symbols=True)``), the nested SDFG
        # unchanged in between: a second walk of all of it
        sdfg.used_symbols = _answered(sdfg, free)
        if {str(s) for s in (*mapping, *free)} <= set(sdfg.symbols):
            state.defined_symbols = dict  # the one call of it in DaCe's method; its answer is not read here
        try:
            return original(state, *args, **kwargs)
        finally:
            del sdfg.used_symbols
            state.__dict__.pop("defined_symbols", None)

    add_nested_sdfg.looked_up_when_read = True
    SDFGState.add_nested_sdfg = add_nested_sdfg


def replace_cfg_list_update() -> None:
    """Add control-flow regions to a tree's region list (``update_cfg_list``, which ``add_nested_sdfg`` calls) with
    one walk of the list per level: the regions not yet listed appended in their order, the list handed up to the
    parent, then every listed region given the parent's list, as DaCe's method does. Regions define no equality of
    their own, so a set of their identities answers what DaCe's ``in`` on the list answered.

    gap: DaCe's method looks each region up in the list by a scan of the list; from two levels down the list it
    adds is the root's own, every region of the tree looked up in itself: 6.1 of the 49 s that generating a 12-layer
    BERT's backward takes, 1,212 library nodes expanded at code generation."""
    region_class = dace.sdfg.state.AbstractControlFlowRegion
    if getattr(region_class.update_cfg_list, "linear", False):
        return

    def update_cfg_list(region, cfg_list) -> None:
        listed = region._cfg_list
        if cfg_list is not listed:
            ids = {id(g) for g in listed}
            for g in cfg_list:
                if id(g) not in ids:
                    ids.add(id(g))
                    listed.append(g)
        if isinstance(region, dace.SDFG) and region.parent_sdfg is not None:
            parent = region.parent_sdfg
        else:
            parent = region._parent_graph
        if parent is None:
            region._cfg_list = listed
            return
        parent.update_cfg_list(listed)
        region._cfg_list = parent.cfg_list
        for g in listed:
            g._cfg_list = region._cfg_list

    update_cfg_list.linear = True
    region_class.update_cfg_list = update_cfg_list


def replace_expansion_scopes() -> None:
    """Keep a state's scopes (``_scope_dict_toparent_cached``) across the expansion of a library node into a nested
    SDFG (``ExpandTransformation.apply``): the nested SDFG's node takes the library node's edges and its place, and
    no other node moves, so where the scopes were kept before the expansion they are handed, with the one node
    replaced, to what reads them when the nested SDFG is integrated (``dealias.integrate_nested_sdfg``: the symbols
    defined at its node). Expansions of scope nodes, and states whose scopes were not kept, as DaCe does them.

    gap: each expansion discards the scopes, and the integration right after it works them out again from the
    state's sources: a walk of the whole state per library node expanded (the ONNX nodes on import, the library
    nodes at code generation)."""
    from dace.sdfg import dealias
    from dace.transformation.transformation import ExpandTransformation

    original_apply, original_integrate = ExpandTransformation.apply, dealias.integrate_nested_sdfg
    if getattr(original_apply, "scopes_kept", False):
        return
    expanding: dict[SDFGState, tuple[dace.nodes.Node, dict]] = {}

    def apply(expansion: ExpandTransformation, state: SDFGState, *args, **kwargs):
        node = state.node(expansion.subgraph[type(expansion)._match_node])
        scopes = state._scope_dict_toparent_cached
        if scopes is None or isinstance(node, (dace.nodes.EntryNode, dace.nodes.ExitNode)):
            return original_apply(expansion, state, *args, **kwargs)
        expanding[state] = (node, scopes)
        try:
            return original_apply(expansion, state, *args, **kwargs)
        finally:
            expanding.pop(state, None)

    def integrate_nested_sdfg(sdfg: dace.SDFG, *args, **kwargs):
        state, added = sdfg.parent, sdfg.parent_nsdfg_node
        replaced, scopes = expanding.pop(state, (None, None))
        if (
            replaced is not None
            and state._scope_dict_toparent_cached is None
            and replaced not in state._nodes  # OrderedDiGraph's own node table
            and added in state._nodes
            and added not in scopes
            and len(state._nodes) == len(scopes)
        ):
            state._scope_dict_toparent_cached = {(added if n is replaced else n): s for n, s in scopes.items()}
        return original_integrate(sdfg, *args, **kwargs)

    apply.scopes_kept = True
    ExpandTransformation.apply = apply
    dealias.integrate_nested_sdfg = integrate_nested_sdfg


#: within ``expansions_reused``: what a library node expanded to, by what decides it (``_expansion_key``)
_reused: dict | None = None
#: the expansions that returned a node, or changed their SDFG: each node of theirs expands anew
_unreusable: set[type] = set()


def replace_expansion_reuse() -> None:
    """Make an expansion within ``expansions_reused`` that one like it ran before (``_expansion_key``) return a copy
    of what that one returned, where it returned an SDFG and changed nothing outside its node and its connectors
    (an array or node added); nested SDFGs named after their node are renamed after the node they replace."""
    from dace.transformation.transformation import ExpandTransformation

    original = ExpandTransformation.apply
    if getattr(original, "reusing", False):
        return

    def apply(expansion: ExpandTransformation, state: SDFGState, sdfg: dace.SDFG, *args, **kwargs):
        memo, kind = _reused, type(expansion)
        node = state.node(expansion.subgraph[kind._match_node])
        reusable = memo is not None and not args and not kwargs and kind not in _unreusable
        key = _expansion_key(kind, node, state, sdfg) if reusable else None
        if key is None:
            return original(expansion, state, sdfg, *args, **kwargs)
        expand = kind.expansion

        def reused(node: dace.nodes.LibraryNode, state: SDFGState, sdfg: dace.SDFG):
            if key in memo:
                made, label, connections = memo[key]
                _connect(node, state, connections)
                made = copy.deepcopy(made)
                made.name = made.name.replace(label, node.label)
                return made
            before = _outside(state, sdfg)
            made = expand(node, state, sdfg)
            if isinstance(made, dace.SDFG) and made.parent is None and _outside(state, sdfg) == before:
                memo[key] = (copy.deepcopy(made), node.label, _connections(node, state))
            else:  # a node that picks another implementation (Reduce, MatMul), or one adding arrays to its SDFG
                _unreusable.add(kind)
            return made

        own = kind.__dict__.get("expansion")
        kind.expansion = staticmethod(reused)  # what DaCe's apply calls, on the class
        try:
            return original(expansion, state, sdfg)
        finally:
            if own is None:
                del kind.expansion
            else:
                kind.expansion = own

    apply.reusing = True
    apply.scopes_kept = getattr(original, "scopes_kept", False)
    ExpandTransformation.apply = apply


@contextlib.contextmanager
def expansions_reused() -> Iterator[None]:
    """Within the block, a library node that expands like one expanded before in it expands to a copy of what that
    one expanded to, its connectors renamed as that one's were (``replace_expansion_reuse``). Alike are nodes of the
    same expansion, properties, memlets, arrays (their descriptors, and the order in which its edges name them),
    enclosing schedules and SDFG symbols; a node reading an ONNX or SDFG constant expands anew.

    gap: DaCe runs each node's expansion anew, the same ops of every layer of a deep network again: 1,824 in a
    12-layer BERT's backward, whose code generation took 27-29 s so, 20-23 s with the expansions reused."""
    global _reused
    outer, _reused = _reused, {} if _reused is None else _reused
    try:
        yield
    finally:
        _reused = outer


def _expansion_key(kind: type, node: dace.nodes.LibraryNode, state: SDFGState, sdfg: dace.SDFG) -> tuple | None:
    """What an expansion of ``node`` reads, its arrays' names left out; None where it reads a constant, whose values
    it may read too."""
    names: dict[str, int] = {}
    edges = []
    for edge, inward in [*((e, True) for e in state.in_edges(node)), *((e, False) for e in state.out_edges(node))]:
        memlet, other = edge.data, edge.src if inward else edge.dst
        if memlet.data is None:
            edges.append((inward, edge.dst_conn if inward else edge.src_conn, type(other).__name__))
            continue
        if inward and _reads_constant(other, sdfg):
            return None
        edges.append(
            (
                inward,
                edge.dst_conn if inward else edge.src_conn,
                type(other).__name__,
                names.setdefault(memlet.data, len(names)),
                str(memlet.subset),
                str(memlet.other_subset),
                str(memlet.wcr),
                memlet.dynamic,
                str(memlet.volume),
                _properties(sdfg.arrays[memlet.data]),
            )
        )
    scopes, here, inner, nested = [], state, node, sdfg
    while True:
        entry = here.entry_node(inner)
        scopes.append(None if entry is None else entry.schedule)
        if nested.parent_nsdfg_node is None:
            break
        scopes.append(getattr(nested.parent_nsdfg_node, "schedule", None))
        here, inner, nested = nested.parent, nested.parent_nsdfg_node, nested.parent_sdfg
    return (kind, _properties(node), tuple(edges), tuple(scopes), repr(sorted(sdfg.symbols.items())))


#: properties that name or place a node or array, and an ONNX op's schema (its class's): no expansion reads them
_NAMING = frozenset({"name", "label", "guid", "debuginfo", "schema"})


def _properties(obj) -> tuple:
    """The DaCe properties of a node or array, those in ``_NAMING`` left out."""
    return tuple((name, repr(getattr(obj, name))) for name in type(obj).__properties__ if name not in _NAMING)


def _reads_constant(source: dace.nodes.Node, sdfg: dace.SDFG) -> bool:
    """Whether ``source`` accesses a constant an expansion may read the values of: the ONNX model's (Clip's bounds,
    Slice's starts) or the SDFG's."""
    if not isinstance(source, dace.nodes.AccessNode):
        return False
    root = onnx_root(sdfg)
    model = None if root is None else root._parent_onnx_model
    return source.data in getattr(model, "clean_weights", {}) or source.data in sdfg.constants_prop


def onnx_root(sdfg: dace.SDFG) -> dace.SDFG | None:
    """The SDFG, ``sdfg`` or one it is nested in, that DaCe's ONNX import left its model on (``_parent_onnx_model``:
    the model's constants, which expansions read); None where there is none."""
    root = sdfg
    while not hasattr(root, "_parent_onnx_model") and root.parent_sdfg is not None:
        root = root.parent_sdfg
    return root if hasattr(root, "_parent_onnx_model") else None


def _outside(state: SDFGState, sdfg: dace.SDFG) -> tuple:
    """What an expansion may change outside the node it replaces, besides the node's connectors: its SDFG's arrays
    and symbols, its state's nodes and edges."""
    return tuple(sdfg.arrays), tuple(sdfg.symbols), state.number_of_nodes(), state.number_of_edges()


def _connections(node: dace.nodes.LibraryNode, state: SDFGState) -> tuple:
    """The node's connectors and those its edges name, in the edges' order (what dcnb's Reduce expansions rename)."""
    return (
        dict(node.in_connectors),
        dict(node.out_connectors),
        [e.dst_conn for e in state.in_edges(node)],
        [e.src_conn for e in state.out_edges(node)],
    )


def _connect(node: dace.nodes.LibraryNode, state: SDFGState, connections: tuple) -> None:
    """Give the node and its edges the connectors ``_connections`` found on a node like it after its expansion."""
    inward, outward, into, out_of = connections
    node.in_connectors, node.out_connectors = dict(inward), dict(outward)
    for edge, connector in zip(state.in_edges(node), into):
        edge._dst_conn = connector
    for edge, connector in zip(state.out_edges(node), out_of):
        edge._src_conn = connector


def replace_nested_sdfg_syncs() -> None:
    """A nested SDFG integrated into a state that ends without a host wait (``nosync``, which the CUDA build's
    ``no_state_syncs`` sets on every state) ends none of its own states with one either.

    gap: library nodes expand at code generation, after the build marked every state, into nested SDFGs whose states
    DaCe's CUDA code generator ends with a stream synchronization: a BERT-base layer's Reduce and transpose
    expansions waited on the host 32 times per call (forward and backward), where the host would have launched the
    next kernels, and a call that waits cannot be captured into a CUDA graph."""
    from dace.sdfg import dealias

    original = dealias.integrate_nested_sdfg
    if getattr(original, "syncs_inherited", False):
        return

    def integrate_nested_sdfg(sdfg: dace.SDFG, *args, **kwargs):
        if getattr(sdfg.parent, "nosync", False):
            for nested in sdfg.all_sdfgs_recursive():
                for state in nested.states():
                    state.nosync = True
        return original(sdfg, *args, **kwargs)

    integrate_nested_sdfg.syncs_inherited = True
    dealias.integrate_nested_sdfg = integrate_nested_sdfg


def replace_stream_numbers() -> None:
    """With one concurrent stream (``max_concurrent_streams = 1``, what dcnb's CUDA builds ask for), every node DaCe's
    CUDA code generator gives a stream gets stream 0.

    gap: its numbering goes on, after a nested SDFG on the host, from the number of streams the nested one needs
    (1), not from a stream of it: a BERT-base layer's kernels after its transposes launched on ``streams[1]`` of a
    context that holds one stream, a read past the end of its array, not the stream each call sets."""
    from dace.codegen.targets.cuda import CUDACodeGen

    original = CUDACodeGen._compute_cudastreams
    if getattr(original, "one_stream", False):
        return

    def compute_cudastreams(self, sdfg: dace.SDFG, default_stream: int = 0, default_event: int = 0):
        found = original(self, sdfg, default_stream, default_event)
        if sdfg.parent is None and int(dace.Config.get("compiler", "cuda", "max_concurrent_streams")) == 1:
            for node, _ in sdfg.all_nodes_recursive():
                if isinstance(getattr(node, "_cuda_stream", None), int):
                    node._cuda_stream = 0
        return found

    compute_cudastreams.one_stream = True
    CUDACodeGen._compute_cudastreams = compute_cudastreams


@contextlib.contextmanager
def scopes_known(state: SDFGState, scopes: dict) -> Iterator[None]:
    """Within the block, ``state.entry_node`` and DaCe's readers of the state's kept scopes
    (``_scope_dict_toparent_cached``: the symbols defined at a node) read ``scopes``, a scope dictionary of the
    state made before changes that moved none of its nodes from its scope (inlines of nested SDFGs). A node added
    since, and a copy (``scope_dict()``, which a caller may walk whole), get the state's scopes worked out again.
    DaCe's own kept scopes are back after the block, unless the state changed within it.

    gap: every change to a state discards its scopes, and a question about one node's scope works them all out
    again: a walk of the whole state per nested SDFG InlineSDFG checks and inlines after inlining the one before."""
    known = _KnownScopes(state, scopes)
    kept = state._scope_dict_toparent_cached
    state._scope_dict_toparent_cached = known
    state.entry_node = known.__getitem__  # DaCe's reads a copy of the whole dictionary
    try:
        yield
    finally:
        del state.entry_node
        if state._scope_dict_toparent_cached is known:
            state._scope_dict_toparent_cached = kept


class _KnownScopes(dict):
    """The scopes a state's nodes had when they were found, read in place of the state's kept scopes."""

    def __init__(self, state: SDFGState, scopes: dict):
        super().__init__(scopes)
        self._state = state

    def __missing__(self, node):
        return self._now()[node]

    def get(self, node, default=None):
        return self[node] if node in self else self._now().get(node, default)

    def __copy__(self) -> dict:
        return self._now()

    def _now(self) -> dict:
        if self._state._scope_dict_toparent_cached is self:
            self._state._scope_dict_toparent_cached = None
        return self._state.scope_dict()


def _answered(sdfg: dace.SDFG, free: set) -> Callable[..., set]:
    """``sdfg.used_symbols`` answering a request for its free symbols (``all_symbols=True`` alone) with ``free``."""
    method = type(sdfg).used_symbols

    def used_symbols(*args, **kwargs) -> set:
        if (args, kwargs) in (((True,), {}), ((), {"all_symbols": True})):
            return set(free)
        return method(sdfg, *args, **kwargs)

    return used_symbols


@contextlib.contextmanager
def cfg_list_rebuilt_once(sdfg: dace.SDFG) -> Iterator[None]:
    """Within the block, a rebuild of the control-flow region list of ``sdfg``'s tree (``reset_cfg_list``, which DaCe's
    InlineSDFG calls after each inline) keeps the list as it was; it is rebuilt once when the block ends. Every
    region keeps its place in the list meanwhile, and a region inlined stays listed until the end.

    gap: each rebuild walks every control-flow region of the whole tree: a walk per nested SDFG inlined (7.5 of
    auto_optimize's 142 s on a 12-layer BERT's backward, 1,044 inlines)."""
    root = sdfg
    while root.parent_sdfg is not None:
        root = root.parent_sdfg
    root.reset_cfg_list = lambda: root._cfg_list  # every region's rebuild is its tree's root's (parents delegate)
    try:
        yield
    finally:
        del root.reset_cfg_list
        root.reset_cfg_list()


@contextlib.contextmanager
def unchanged_shared_in_copies(
    sdfg: dace.SDFG, subgraph: dace.sdfg.state.StateSubgraphView, entries: list[dace.nodes.MapEntry]
) -> Iterator[None]:
    """Within the block, the copy of ``sdfg`` that CompositeFusion's test makes (``copy.deepcopy`` in its module)
    shares with ``sdfg`` what the test does not change instead of copying it: the nodes of the subgraph's state
    outside the subgraph and the scopes of its outermost maps (``entries``), the memlets between them, the SDFGs
    nested in nodes outside them, the arrays' descriptors. The test expands those maps in the copy (their parameters
    and the memlets and nodes in their scopes) and reads the rest. A copy points the nested SDFGs it meets at its own
    parents (node, state, SDFG, list of control-flow regions); after the block every shared one points at its own
    again.

    gap: CompositeFusion tests maps whose parameters differ in order on a copy of the whole SDFG: 36 copies of a
    MobileViT's backward (2,200 nodes, 1,500 arrays), 54 of its auto_optimize's 100 s."""
    from dace.transformation.subgraph import composite

    shared: list[tuple[dace.nodes.NestedSDFG, SDFGState]] = []

    def deepcopy(value, memo=None):
        if value is not sdfg:
            return copy.deepcopy(value, memo)
        state = subgraph.graph
        inside = set(subgraph.nodes())
        for entry in entries:
            inside.update(state.scope_subgraph(entry).nodes())
        shared.extend(
            (node, parent)
            for parent in sdfg.states()
            for node in parent.nodes()
            if isinstance(node, dace.nodes.NestedSDFG) and node.sdfg is not None and node not in inside
        )
        memo = dict(memo or {})
        memo.update({id(node.sdfg): node.sdfg for node, _ in shared})
        memo.update({id(node): node for node in state.nodes() if node not in inside})
        memo.update({id(e.data): e.data for e in state.edges() if e.src not in inside and e.dst not in inside})
        memo.update({id(desc): desc for desc in sdfg.arrays.values()})
        return copy.deepcopy(value, memo)

    module_copy = composite.copy
    composite.copy = type("SharingCopy", (), {"deepcopy": staticmethod(deepcopy)})
    try:
        yield
    finally:
        composite.copy = module_copy
        if shared:
            for node, parent in shared:
                node.sdfg.parent_nsdfg_node, node.sdfg.parent, node.sdfg.parent_sdfg = node, parent, parent.sdfg
            sdfg.reset_cfg_list()


def replace_simplify_pass(old: type, new: type) -> None:
    """Put ``new`` in place of the pass ``old`` in DaCe's simplify: ``SimplifyPass`` instantiates the classes of the
    module list ``SIMPLIFY_PASSES`` each time it is made, which ``sdfg.simplify`` does on every call; no registry
    or argument offers another pass."""
    passes = simplify_passes.SIMPLIFY_PASSES
    if old in passes:
        passes[passes.index(old)] = new


def replace_program_parses(parse: Callable[..., dace.SDFG]) -> None:
    """Make DaCe's own ONNX expansions parse their programs through ``parse`` (in place of ``program_for_node``, with
    its arguments): each module of ``dace.libraries.onnx.op_implementations`` calls ``program_for_node`` by the name
    it imported, and ``python_pure_op_implementation``'s expansions by the name in ``utils``, so those names are
    what is replaced.

    gap: DaCe parses an expansion's Python program into an SDFG each time a node expands, the same ops of every layer
    again: 552 parses, 57 of the 202 s that generating a 12-layer BERT's backward took, profiled."""
    import importlib
    import pkgutil

    import dace.libraries.onnx.op_implementations as implementations
    from dace.libraries.onnx.op_implementations import utils

    original = utils.program_for_node
    if getattr(original, "routed", False):
        return
    for info in pkgutil.iter_modules(implementations.__path__):
        module = importlib.import_module(f"{implementations.__name__}.{info.name}")
        if getattr(module, "program_for_node", None) is original:
            module.program_for_node = parse
    parse.routed = True


# --- graph edits ----------------------------------------------------------------------------------------------


def rename_connectors(state: dace.SDFGState, node: dace.nodes.Node, into: str, out_of: str) -> None:
    """Point a node's only in-edge at connector ``into`` and its only out-edge at ``out_of``: an edge's connectors
    are read-only properties, and removing and re-adding the edges would renumber what a caller iterates over."""
    state.in_edges(node)[0]._dst_conn = into
    state.out_edges(node)[0]._src_conn = out_of


# --- compiled binaries ----------------------------------------------------------------------------------------


def initialized_state(binary: CompiledSDFG) -> int:
    """The address of a loaded binary's state, initialized as ``CompiledSDFG.fast_call`` does on a first call (a
    program without symbols takes no initialization arguments): native.cpp calls the binary's entry without
    going through ``CompiledSDFG``, which keeps its library, its initialization and the handle private."""
    if not binary._initialized:
        binary._lib.load()
        binary._initialize(())
    return binary._libhandle.value


def signature(binary: CompiledSDFG) -> tuple[dict[str, dace.data.Data], list[str], bool]:
    """A loaded binary's arguments by name, their names in the C signature's order and whether its SDFG has free
    symbols, as ``CompiledSDFG.__init__`` worked them out and keeps them private (``_typedict``, ``_sig``,
    ``_free_symbols``): asking the SDFG again walks all of it (``arglist``: 3.5 s each on a 12-layer BERT's
    backward under load)."""
    return binary._typedict, binary._sig, bool(binary._free_symbols)


def release_arguments(binary: CompiledSDFG) -> None:
    """Drop the references a ``CompiledSDFG.__call__`` keeps to its arguments (for workspace queries and return
    values dcnb does not use): they would hold those tensors, pooled output buffers among them, for as long as the
    binary lives, and the pool would hand out fresh (page-faulting) memory instead."""
    binary._lastargs = None
    binary._return_arrays = ()
    binary._argument_to_pyobject.clear()
