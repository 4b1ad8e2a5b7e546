"""DaCe's simplify, as every dcnb phase runs it: with the write-conflict resolutions it drops put back, and without
a removal of copies that it cannot carry out or that leaves a library node an operand of another shape."""

from __future__ import annotations

import ast
import re

import dace
from dace.frontend.python import astutils
from dace.properties import CodeBlock
from dace.sdfg import nodes
from dace.transformation.dataflow import redundant_array
from dace.transformation.passes import array_elimination


def simplify(sdfg: dace.SDFG, validate: bool = True) -> None:
    """:func:`connectors_apart_from_outer_names`, DaCe's simplify pipeline over ``sdfg``, then
    :func:`keep_write_conflicts`."""
    connectors_apart_from_outer_names(sdfg)
    sdfg.simplify(validate=validate)
    keep_write_conflicts(sdfg)


def connectors_apart_from_outer_names(sdfg: dace.SDFG) -> int:
    """Rename each connector of a tasklet in a nested SDFG that is named like an array, symbol or constant of an SDFG
    around it; returns how many were.

    gap: simplify inlines nested SDFGs, then refuses a tasklet connector named like an array of the SDFG it now sits
    in ("Connector name 'c' is already used": a forward with an input named ``c`` that a Linear's Gemm reads).
    """
    renamed = 0
    for nested in sdfg.all_sdfgs_recursive():
        outer, parent = set(), nested.parent_sdfg
        while parent is not None:
            outer |= set(parent.arrays) | set(parent.symbols) | set(parent.constants)
            parent = parent.parent_sdfg
        for state in nested.states() if outer else ():
            for tasklet in [n for n in state.nodes() if isinstance(n, nodes.Tasklet)]:
                for old in sorted((set(tasklet.in_connectors) | set(tasklet.out_connectors)) & outer):
                    taken = outer | set(nested.arrays) | set(tasklet.in_connectors) | set(tasklet.out_connectors)
                    _rename_connector(state, tasklet, old, dace.utils.find_new_name(old, taken))
                    renamed += 1
    return renamed


def _rename_connector(state: dace.SDFGState, tasklet: nodes.Tasklet, old: str, new: str) -> None:
    if tasklet.code.language == dace.Language.Python:
        tree = astutils.ASTFindReplace({old: new}).visit(ast.parse(tasklet.code.as_string))
        code = astutils.unparse(tree)
    else:
        code = re.sub(rf"\b{re.escape(old)}\b", new, tasklet.code.as_string)
    tasklet.code = CodeBlock(code, tasklet.code.language)
    for connectors, edges, end in (
        (tasklet.in_connectors, state.in_edges(tasklet), "dst_conn"),
        (tasklet.out_connectors, state.out_edges(tasklet), "src_conn"),
    ):
        if old in connectors:
            connectors[new] = connectors.pop(old)
            for edge in edges:
                if getattr(edge, end) == old:
                    setattr(edge, end, new)


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


class _LibraryOperandsKeepShape(redundant_array.RedundantArray):
    """DaCe's RedundantArray, but a view a library node writes stays where it is shaped unlike what it views."""

    # gap: RedundantArray merges a view into the view it is a view of, and a Gemm that wrote the matrix of a 3-d
    # array's reshape then writes the 3-d array, which DaCe's own validation refuses ("matrix-matrix product only
    # supported on matrices": a MatMul's backward writing its input gradient in place, built for CUDA)
    def can_be_applied(self, graph, expr_index, sdfg, permissive=False) -> bool:
        if not super().can_be_applied(graph, expr_index, sdfg, permissive):
            return False
        in_desc, out_desc = sdfg.arrays[self.in_array.data], sdfg.arrays[self.out_array.data]
        if not isinstance(in_desc, dace.data.View) or tuple(in_desc.shape) == tuple(out_desc.shape):
            return True
        return not any(isinstance(e.src, nodes.LibraryNode) for e in graph.in_edges(self.in_array))


array_elimination.RedundantArray = _LibraryOperandsKeepShape
