"""What a step changed: the nodes of an SDFG matched with those of the SDFG it was made from.

The session uses it to find where a node an action searched for is drawn (``counterparts``), the views to mark
what a step added, changed and removed. It knows nodes and states, not how either is drawn.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable, Container, Hashable, Iterator
from typing import Any

import dace
from dace.sdfg import nodes

from .actions.matching import label
from .names import state_stem

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


def kind(node: nodes.Node) -> str:
    """A node's kind, as the pictures carry it and a node's signature compares it."""
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


def counterparts(source: dace.SDFG, shown: dace.SDFG) -> dict[nodes.Node, str]:
    """Node of ``source`` -> the guid of the node of ``shown`` it is (as a step's diff matches them): where a
    node found in the SDFG an action searched is drawn in the picture of the SDFG compiled from it. Matched once
    per pair (a session's SDFGs do not change once built, and every refresh of the actions asks again)."""
    known = _counterparts.get(source)
    if known is None or known[0] is not shown:
        known = _counterparts[source] = (shown, {old: new.guid for new, old in Diff(source, shown).match.items()})
    return known[1]


#: ``counterparts`` by source SDFG: the SDFG shown and what was matched
_counterparts: weakref.WeakKeyDictionary[dace.SDFG, tuple[dace.SDFG, dict[nodes.Node, str]]] = (
    weakref.WeakKeyDictionary()
)


#: a node where it is drawn: the node, its state, the SDFG whose arrays it reads
Placed = tuple[nodes.Node, dace.SDFGState, dace.SDFG]


class Diff:
    """The nodes of an SDFG matched with those of the SDFG its step was made from.

    A node is the same node where its DaCe guid is: transformations keep the nodes they leave alone and give the
    ones they make new guids. Guids do not say it all: DaCe's ``deepcopy`` gives every access node a new one (and
    each step works on copies), and regenerating the backward after a step before autodiff makes every node anew.
    The nodes no guid matches are matched by what they are, state by state and then across their SDFG: an access
    node by its array, any other node by its kind, its label and the arrays its memlets move, in their order.
    """

    def __init__(self, before: dace.SDFG, after: dace.SDFG):
        #: the SDFG of the step made from (the removed nodes' names are read from it)
        self.before = before
        #: node of ``after`` -> the node of ``before`` it is
        self.match: dict[nodes.Node, nodes.Node] = {}
        self._before: dict[nodes.Node, Placed] = {n[0]: n for n in placed(before)}
        self._after: dict[nodes.Node, Placed] = {n[0]: n for n in placed(after)}
        self._matched: set[nodes.Node] = set()
        self._states: dict[dace.SDFGState, dace.SDFGState] = {}
        self._sdfgs: dict[dace.SDFG, dace.SDFG] = {}
        by_guid: dict[str, collections.deque[nodes.Node]] = collections.defaultdict(collections.deque)
        for node in self._before:
            by_guid[node.guid].append(node)
        for node in self._after:
            if by_guid[node.guid]:  # a copy of a node within one SDFG keeps its guid too: the first is the node
                self._pair(node, by_guid[node.guid].popleft())
        pending = [(before, after)]
        while pending:
            old, new = pending.pop()
            self._sdfgs[old] = new
            self._pair_states(old, new)
            for old_state in old.states():
                if (new_state := self._states.get(old_state)) is not None:
                    self._pair_alike(
                        _unmatched_in(old_state, old, self._matched), _unmatched_in(new_state, new, self.match)
                    )
            self._pair_alike(
                [p for s in old.states() for p in _unmatched_in(s, old, self._matched)],
                [p for s in new.states() for p in _unmatched_in(s, new, self.match)],
            )
            for state in new.states():
                for node in state.nodes():
                    if isinstance(node, nodes.NestedSDFG) and isinstance(self.match.get(node), nodes.NestedSDFG):
                        pending.append((self.match[node].sdfg, node.sdfg))
        #: the nodes of ``before`` gone from ``after``, each with the state of ``after`` that took the place of
        #: its own (None if none did): a map by its entry, a nested SDFG gone as itself (not what it held)
        self.removed: list[tuple[nodes.Node, dace.SDFGState | None]] = [
            (node, self._states.get(state))
            for node, state, sdfg in self._before.values()
            if node not in self._matched and not isinstance(node, nodes.ExitNode) and sdfg in self._sdfgs
        ]

    def placed_before(self, node: nodes.Node) -> Placed:
        """Where a node of ``before`` stood: the node, its state, its SDFG."""
        return self._before[node]

    def placed_after(self, node: nodes.Node) -> Placed:
        """Where a node of ``after`` stands: the node, its state, its SDFG."""
        return self._after[node]

    def _pair(self, new: nodes.Node, old: nodes.Node) -> None:
        self.match[new] = old
        self._matched.add(old)

    def _pair_states(self, old: dace.SDFG, new: dace.SDFG) -> None:
        """States by guid, then by label, then by readable label (splits while inlining grow labels)."""
        keys: tuple[Callable[[dace.SDFGState], Hashable], ...] = (
            lambda s: s.guid,
            lambda s: s.label,
            lambda s: state_stem(s.label),
        )
        for key in keys:
            paired = set(self._states.values())
            unpaired = [s for s in new.states() if s not in paired]
            for old_state, new_state in _alike([s for s in old.states() if s not in self._states], unpaired, key):
                self._states[old_state] = new_state

    def _pair_alike(self, old: list[Placed], new: list[Placed]) -> None:
        for (old_node, _, _), (new_node, _, _) in _alike(old, new, _signature):
            self._pair(new_node, old_node)


def _alike(old: list, new: list, key: Callable) -> Iterator[tuple[Any, Any]]:
    """Items of ``old`` and ``new`` with equal keys, paired in their order."""
    waiting: dict[Hashable, collections.deque] = collections.defaultdict(collections.deque)
    for item in old:
        waiting[key(item)].append(item)
    for item in new:
        if queue := waiting.get(key(item)):
            yield queue.popleft(), item


def placed(sdfg: dace.SDFG) -> Iterator[Placed]:
    """Every node a picture of ``sdfg`` draws, nested SDFGs' included."""
    for state in sdfg.states():
        for node in state.nodes():
            yield node, state, sdfg
            if isinstance(node, nodes.NestedSDFG):
                yield from placed(node.sdfg)


def _unmatched_in(state: dace.SDFGState, sdfg: dace.SDFG, matched: Container[nodes.Node]) -> list[Placed]:
    return [(node, state, sdfg) for node in state.nodes() if node not in matched]


def _signature(placed: Placed) -> Hashable:
    node, state, _ = placed
    if isinstance(node, nodes.AccessNode):
        return ACCESS, node.data
    # a map's exit goes with its entry: both by what the entry moves
    mover = state.entry_node(node) if isinstance(node, nodes.ExitNode) else node
    moved = frozenset(e.data.data for e in state.all_edges(mover) if e.data is not None and e.data.data is not None)
    return kind(node), label(node), moved
