"""Where a DaCe transformation matches, narrowed to the nodes a user named (``where``), and applying matches in
rounds until none is left."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection, Iterator

import dace
from dace.sdfg import nodes
from dace.sdfg.propagation import propagate_memlets_sdfg
from dace.transformation import PatternTransformation
from dace.transformation.dataflow import MapFusionVertical
from dace.transformation.optimizer import Optimizer

from .. import dace_internals

#: node labels an action is restricted to, or None for everywhere
Where = Collection[str] | None


def label(node: nodes.Node) -> str:
    """The name ``where`` matches a node by, as the graph views show it: an array's name, a map's or a node's label."""
    if isinstance(node, nodes.AccessNode):
        return node.data
    if isinstance(node, (nodes.MapEntry, nodes.MapExit)):
        return node.map.label
    return getattr(node, "label", str(node))


def matches(
    xform: type[PatternTransformation], sdfg: dace.SDFG, where: Where = None, options: dict | None = None
) -> Iterator[PatternTransformation]:
    """The places ``xform`` applies in ``sdfg`` that touch a node named in ``where``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for match in Optimizer(sdfg).get_pattern_matches(patterns=[xform], options=[options] if options else None):
            if touches(match, where):
                yield match


def touches(match: PatternTransformation, where: Where) -> bool:
    """Whether ``match`` binds a node named in ``where`` (any, where None)."""
    return where is None or any(label(n) in where for n in dace_internals.pattern_nodes(match))


def apply_in_rounds(
    find: Callable[[], Iterator[PatternTransformation]],
    apply: Callable[[PatternTransformation], object] = lambda match: match.apply_pattern(append=False),
    accept: Callable[[PatternTransformation], bool] = lambda match: True,
) -> int:
    """Apply, one after the other, each match ``find`` yields that ``accept``s and still applies to the graph as
    the ones before it left it; again until a round applies none. Returns how many were applied.

    A round tests each place once: matching again from the start after every fusion tested the same refused places
    hundreds of times (10k MapFusion tests for 325 fusions on a ViT's backward).
    """
    applied = 0
    while True:
        places = [_Place(match) for match in find() if accept(match)]
        ids: dict[dace.SDFGState, dict[nodes.Node, int]] = {}
        before = applied
        for place in places:
            match = place.bind(ids)
            if match is None or not accept(match):
                continue
            state, sdfg = dace_internals.match_state(match), dace_internals.match_sdfg(match)
            if match.can_be_applied(state, match.expr_index, sdfg):
                apply(match)
                ids.pop(state, None)  # node ids shift as a state changes; the nodes do not
                applied += 1
        if applied == before:
            return applied


def apply_in_rounds_then_propagate(
    sdfg: dace.SDFG,
    find: Callable[[], Iterator[PatternTransformation]],
    accept: Callable[[PatternTransformation], bool] = lambda match: True,
    before: Callable[[PatternTransformation], object] = lambda match: None,
    after: Callable[[PatternTransformation], object] = lambda match: None,
) -> int:
    """``apply_in_rounds`` with the memlets of ``sdfg`` propagated once, after the last match: DaCe propagates them
    over the whole SDFG after each (95% of map fusion's time on a ResNet-18, 99% of vectorization's). ``before``
    prepares each match just before it is applied, ``after`` finishes it just after (before the propagation)."""

    def applied_unpropagated(match: PatternTransformation) -> None:
        before(match)
        apply_unpropagated(match)
        after(match)

    applied = apply_in_rounds(find, applied_unpropagated, accept)
    if applied:
        propagate_memlets_sdfg(sdfg)
    return applied


def apply_unpropagated(match: PatternTransformation) -> None:
    """Apply ``match`` without propagating the memlets of the whole SDFG afterwards (``annotate``), which the
    caller does once, or need not: a map fusion still propagates those of the fused map where it must."""
    if isinstance(match, MapFusionVertical) and not _may_consolidate(match):
        # gap: MapFusion propagates the fused map's memlets, rebuilding the state's scope tree twice, whenever it may
        # consolidate two inputs of the same data into one connector, the one change that can widen a memlet, not
        # only where it can; where it cannot, never consolidating changes nothing but that (ResNet-18's backward
        # under fuse_rows: 27 -> 19 s)
        match.never_consolidate_edges = True
    match.apply_pattern(append=False, annotate=False)


def _may_consolidate(fusion: MapFusionVertical) -> bool:
    """Whether a map fusion may merge two of its inputs into one connector: DaCe does so only for maps at the top of
    their state, where two inputs of the fused map read the same data."""
    state = dace_internals.match_state(fusion)
    first = state.entry_node(fusion.first_map_exit)
    if state.entry_node(first) is not None:
        return False
    read = [
        e.data.data
        for entry in (first, fusion.second_map_entry)
        for e in state.in_edges(entry)
        if not e.data.is_empty() and e.dst_conn is not None and e.dst_conn.startswith("IN_")
    ]
    return len(read) != len(set(read))


class _Place:
    """Where a match was found: its transformation, options and nodes, to be bound again after the graph changed."""

    def __init__(self, match: PatternTransformation):
        self.xform, self.expr_index = type(match), match.expr_index
        self.sdfg, self.state = dace_internals.match_sdfg(match), dace_internals.match_state(match)
        self.options = {name: getattr(match, name) for name in self.xform.__properties__}
        self.nodes = dace_internals.bound_nodes(match)

    def bind(self, ids: dict[dace.SDFGState, dict[nodes.Node, int]]) -> PatternTransformation | None:
        """The transformation on the same nodes, or None where one of them is gone."""
        if self.state not in ids:
            ids[self.state] = {node: i for i, node in enumerate(self.state.nodes())}
        index = ids[self.state]
        if any(node not in index for node in self.nodes.values()):
            return None
        match = self.xform()
        subgraph = {pattern: index[node] for pattern, node in self.nodes.items()}
        match.setup_match(self.sdfg, self.state.parent_graph.cfg_id, self.state.block_id, subgraph, self.expr_index,
                          options=self.options)
        return match
