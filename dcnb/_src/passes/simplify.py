"""DaCe's simplify, as every dcnb phase runs it: with the write-conflict resolutions it drops put back, and without
a removal of copies that it cannot carry out."""

from __future__ import annotations

import dace
from dace.sdfg import nodes
from dace.transformation.dataflow import redundant_array
from dace.transformation.passes import array_elimination


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


class _ComposableWriteSlice(redundant_array.RedundantWriteSlice):
    """DaCe's RedundantWriteSlice where the writes it would redirect compose with the slice."""

    # gap: RedundantWriteSlice tells a slice's axes by their strides, which repeat where an axis has size 1, and then
    # fails composing the writes halfway through changing them (an elementwise result copied into x[:, :, None]:
    # rotary embeddings before multi-query attention's repeat_kv); such a copy now stays
    def can_be_applied(self, graph, expr_index, sdfg, permissive=False) -> bool:
        if not super().can_be_applied(graph, expr_index, sdfg, permissive):
            return False
        in_desc, out_desc = sdfg.arrays[self.in_array.data], sdfg.arrays[self.out_array.data]
        copy_edge = graph.edges_between(self.in_array, self.out_array)[0]
        viewed = copy_edge.data.get_src_subset(copy_edge, graph)
        sliced = redundant_array._sliced_dims(out_desc, in_desc)
        kept = [i for i in range(len(out_desc.shape) - 1, -1, -1) if i not in sliced]
        target, popped = redundant_array.pop_dims(copy_edge.data.get_dst_subset(copy_edge, graph), kept)
        try:  # what apply does to each write, on copies of their subsets
            for write in graph.in_edges(self.in_array):
                for edge in graph.memlet_tree(write):
                    _, written = redundant_array._validate_subsets(edge, sdfg.arrays, dst_name=self.in_array.data)
                    written.offset(viewed, negative=True)
                    redundant_array.compose_and_push_back(target, written, kept, popped)
        except (ValueError, NotImplementedError):
            return False
        return True


array_elimination.RedundantWriteSlice = _ComposableWriteSlice  # what simplify's ArrayElimination instantiates
