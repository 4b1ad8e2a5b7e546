"""DaCe's simplify, as every dcnb phase runs it: with the write-conflict resolutions it drops put back."""

from __future__ import annotations

import dace
from dace.sdfg import nodes


def simplify(sdfg: dace.SDFG, validate: bool = True) -> None:
    """DaCe's simplify pipeline over ``sdfg``, then :func:`keep_write_conflicts`."""
    sdfg.simplify(validate=validate)
    keep_write_conflicts(sdfg)


def keep_write_conflicts(sdfg: dace.SDFG) -> int:
    """Give each edge of a written memlet path the write-conflict resolution its outermost edge has; returns the
    edges mended.

    gap: simplify's scalar-to-symbol promotion rewrites a tasklet's indirect write (``gradient[index]``, Gather's
    backward) as a memlet of its own and drops its resolution; only the map exit's outer edge keeps it, the next
    memlet propagation rebuilds that edge from the inner one, and the sum becomes an overwrite (a BERT encoder's
    weight gradients after fuse_rows or auto_optimize).
    """
    mended = 0
    for nested in sdfg.all_sdfgs_recursive():
        for state in nested.states():
            for node in state.nodes():
                if not isinstance(node, nodes.ExitNode):
                    continue
                for outer in state.out_edges(node):
                    if outer.data.wcr is None or isinstance(outer.dst, nodes.ExitNode):
                        continue
                    for edge in state.memlet_tree(outer):
                        if edge.data.wcr is None and not edge.data.is_empty():
                            edge.data.wcr = outer.data.wcr
                            mended += 1
    return mended
