"""Where a DaCe transformation matches, narrowed to the nodes a user named (``where``), and applying matches one
at a time until none is left."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection, Iterator

import dace
from dace.sdfg import nodes
from dace.transformation import PatternTransformation
from dace.transformation.optimizer import Optimizer

from . import dace_internals

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
            if where is None or any(label(n) in where for n in dace_internals.pattern_nodes(match)):
                yield match


def apply_repeated(
    find: Callable[[], PatternTransformation | None],
    apply: Callable[[PatternTransformation], object] = lambda match: match.apply_pattern(append=False),
) -> int:
    """Apply the match ``find`` returns until it returns None (each application changes what matches); returns
    how many were applied."""
    applied = 0
    while (match := find()) is not None:
        apply(match)
        applied += 1
    return applied
