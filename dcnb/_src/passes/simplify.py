"""DaCe's simplify, as every dcnb phase runs it: with the write-conflict resolutions it drops put back, without
a removal of copies that it cannot carry out or that leaves a library node an operand of another shape, and with its
inlining and symbol propagation made to scale with the graph (a 12-layer BERT's backward has 1,320 expanded ops to
inline after fuse_rows expands them)."""

from __future__ import annotations

import ast
import re

import dace
from dace.frontend.python import astutils
from dace.properties import CodeBlock
from dace.sdfg import nodes
from dace.sdfg import utils as sdutil
from dace.transformation.interstate import InlineSDFG
from dace.transformation.dataflow import redundant_array
from dace.transformation.passes import array_elimination
from dace.transformation.passes.symbol_propagation import SymbolPropagation

from .. import dace_internals


def simplify(sdfg: dace.SDFG, validate: bool = True) -> None:
    """:func:`connectors_apart_from_outer_names`, :func:`inline_single_states`, :func:`inline_the_others`, DaCe's
    simplify pipeline over ``sdfg``, then :func:`keep_write_conflicts`."""
    connectors_apart_from_outer_names(sdfg)  # before any inlining, as simplify does
    inline_single_states(sdfg)
    inline_the_others(sdfg)
    sdfg.simplify(validate=validate)
    keep_write_conflicts(sdfg)


def inline_single_states(sdfg: dace.SDFG) -> int:
    """Inline each nested SDFG of one state into the state around it (DaCe's InlineSDFG), innermost first, where
    DaCe allows it; returns how many were.

    gap: DaCe's simplify inlines with InlineMultistateSDFG first, even a nested SDFG of one state, and that splits
    the state around it in three (``isolate_nested_sdfg``: a walk of the whole state) for StateFusion to merge again:
    a 12-layer BERT's 312 expanded ONNX ops took 29.5 s to simplify under load 2, 13.9 s inlined here first (the same
    1,469 nodes in one state). The list of the tree's control-flow regions is rebuilt once, after them all, and each
    state's scopes are worked out once for the checks (``dace_internals.scopes_known``), not after each inline."""
    inlined, scopes = 0, {}
    with dace_internals.cfg_list_rebuilt_once(sdfg):
        for node in reversed([n for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nodes.NestedSDFG)]):
            state = node.sdfg.parent
            # an inline moves no other node of its state from its scope: the scopes found once serve every inline
            if node not in scopes.get(state, ()):
                scopes[state] = state.scope_dict()
            inliner = InlineSDFG()
            match = {InlineSDFG.nested_sdfg: node}
            inliner.setup_match(state.sdfg, state.parent_graph.cfg_id, state.block_id, match, 0, override=True)
            with dace_internals.scopes_known(state, scopes[state]):
                if inliner.can_be_applied(state, 0, state.sdfg):
                    inliner.apply(state, state.sdfg)
                    inlined += 1
    return inlined


def inline_the_others(sdfg: dace.SDFG) -> int:
    """Inline the nested SDFGs that DaCe's InlineMultistateSDFG inlines and InlineSDFG did not (DaCe's
    ``inline_sdfgs``), one call after another until a call inlines none; returns how many were.

    gap: ``inline_sdfgs`` inlines one of a chain of them per call (the one before another writes two arrays, and the
    state cannot be split around the other until it is inlined), and simplify's pipeline calls it once per round,
    each round running every other pass over the whole SDFG, and fusing the states it split: the 25 LayerNorm
    backwards of a 12-layer BERT's backward took 26 rounds after auto_optimize expanded them, 64 of its 166 s, where
    these calls and 3 rounds took 16 s (the same nodes, memlets and arrays); where the fused states cannot be split
    again, DaCe's leaves the rest nested."""
    inlined = 0
    while count := sdutil.inline_sdfgs(sdfg, multistate=True):
        inlined += count
    return inlined


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


class _ComposingSlice:
    """A slice's removal (DaCe's RedundantReadSlice, RedundantWriteSlice) only where each subset of the view it would
    redirect to the array composes with the slice: composed as the removal does, on copies, before any edge changes."""

    #: the view is written and copied into the array (else copied out of it and read)
    writes = False

    def can_be_applied(self, graph, expr_index, sdfg, permissive=False) -> bool:
        if not super().can_be_applied(graph, expr_index, sdfg, permissive):
            return False
        view, array = (self.in_array, self.out_array) if self.writes else (self.out_array, self.in_array)
        copy = graph.edges_between(self.in_array, self.out_array)[0]
        array_part, view_part = copy.data.get_src_subset(copy, graph), copy.data.get_dst_subset(copy, graph)
        if self.writes:
            array_part, view_part = view_part, array_part
        array_desc, view_desc = sdfg.arrays[array.data], sdfg.arrays[view.data]
        sliced = redundant_array._sliced_dims(array_desc, view_desc)
        kept = [i for i in range(len(array_desc.shape) - 1, -1, -1) if i not in sliced]
        base, popped = redundant_array.pop_dims(array_part, kept)
        named = {"dst_name": view.data} if self.writes else {"src_name": view.data}
        try:
            for edge in graph.in_edges(view) if self.writes else graph.out_edges(view):
                for part in graph.memlet_tree(edge):
                    subset = redundant_array._validate_subsets(part, sdfg.arrays, **named)[int(self.writes)]
                    subset.offset(view_part, negative=True)
                    redundant_array.compose_and_push_back(base, subset, kept, popped)
        except (ValueError, NotImplementedError):
            return False
        return True


class _ComposableWriteSlice(_ComposingSlice, redundant_array.RedundantWriteSlice):
    # gap: RedundantWriteSlice tells a slice's axes by their strides, which repeat where an axis has size 1, and then
    # fails composing the writes halfway through changing them (an elementwise result copied into x[:, :, None]:
    # rotary embeddings before multi-query attention's repeat_kv); such a copy now stays
    writes = True


class _ComposableReadSlice(_ComposingSlice, redundant_array.RedundantReadSlice):
    # gap: RedundantReadSlice failed the same way composing a read of one element per row ("Dimension mismatch in
    # composition": a 2-layer BERT encoder from token ids, in training mode, placed in GPU memory); such a slice stays
    writes = False


# what simplify's ArrayElimination instantiates
array_elimination.RedundantWriteSlice = _ComposableWriteSlice
array_elimination.RedundantReadSlice = _ComposableReadSlice


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


class _SymbolPropagationWhereAssigned(SymbolPropagation):
    """DaCe's SymbolPropagation, which does nothing where no interstate edge of the SDFG or its nested SDFGs assigns a
    symbol (symbols get values only there), skipped there.

    gap: SymbolPropagation works out the free symbols of the whole SDFG before and after it propagates, to check that
    it introduced none, each a walk of every state's reads and writes: 40 of fuse_rows' 290 s (profiled) on a
    12-layer BERT's backward, which has no such assignment. That walk also sets each memlet's source and destination
    (``Memlet.try_initialize``, which DaCe's reads and writes call first), and the passes after it rely on that (a
    memlet moved by inlining kept the state it came from: fuse_rows then failed on a LayerNorm left nested), so
    where the pass is skipped, that part is done."""

    def apply_pass(self, sdfg: dace.SDFG, pipeline_results) -> set[str] | None:
        nested = list(sdfg.all_sdfgs_recursive())
        if any(e.data.assignments for each in nested for e in each.all_interstate_edges()):
            return super().apply_pass(sdfg, pipeline_results)
        for state in (state for each in nested for state in each.states()):
            for edge in state.edges():
                edge.data.try_initialize(state.sdfg, state, edge)
        return None


dace_internals.replace_simplify_pass(SymbolPropagation, _SymbolPropagationWhereAssigned)
