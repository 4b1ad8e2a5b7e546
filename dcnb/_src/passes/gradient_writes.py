"""Gradients written, not accumulated: where the backward writes every element of a gradient exactly once, the
caller need not zero it before the call (a pass over memory saved). A pass after autodiff makes single writes
plain writes; ``Writes.overwritten`` tells the module which gradients it may hand over unzeroed."""

from __future__ import annotations

from collections import defaultdict

import dace
from dace.sdfg import nodes


def write_gradients_once(sdfg: dace.SDFG) -> int:
    """Where one map writes each element of a gradient exactly once, write instead of accumulating (WCR), so that
    the caller need not zero the array first: a pass over memory saved (see ``Writes.overwritten``). Returns how
    many.

    The gradients are the backward SDFG's arguments it writes and never reads (the others are the outputs'
    gradients and the values the forward stored, which it reads)."""
    writes = Writes(sdfg)
    return sum(writes.write_once(name) for name, desc in list(sdfg.arrays.items()) if not desc.transient)


def write_accumulators_once(sdfg: dace.SDFG) -> int:
    """Where a zeroed temporary (a gradient accumulator autodiff made) has one access node and one map writing each
    of its elements once, before anything reads it there, write instead of adding and drop the zeroing (a map over
    the array per call: 0.25-0.3 ms each for the BERT-mini layer's GELU). Returns how many."""
    writes = Writes(sdfg)
    written = 0
    for name, found in writes.nodes.items():
        desc = sdfg.arrays.get(name)  # (None: a nested SDFG's own array)
        if desc is None or not desc.transient or len(found) != 1 or not found[0][0].setzero:
            continue
        if writes.write_once(name, read_after=True):
            found[0][0].setzero = False
            written += 1
    return written


class Writes:
    """Who writes an SDFG's arrays: its access nodes (its nested SDFGs' included) by data name, found in one walk,
    so that asking about each array is not a walk of the whole SDFG each (a 12-layer BERT's backward asked 1,660
    times: 18 of its autodiff's 52 s). It holds while no access node is added or removed; writes made plain, or a
    node's zeroing dropped, keep it."""

    def __init__(self, sdfg: dace.SDFG):
        self.sdfg = sdfg
        self.nodes: dict[str, list[tuple[nodes.AccessNode, dace.SDFGState]]] = defaultdict(list)
        for node, state in sdfg.all_nodes_recursive():
            if isinstance(node, nodes.AccessNode):
                self.nodes[node.data].append((node, state))

    def write_once(self, name: str, read_after: bool = False) -> bool:
        """Where the only writer of ``name`` (a map writing each element once, or a library node writing all of
        it) accumulates into it, make it write; whether it did. ``read_after``: the written node may also be read
        from."""
        found = self._single_writer(name, read_after)
        if found is None:
            return False
        state, edge = found
        path = state.memlet_path(edge)
        if len(path) == 1 and isinstance(edge.src, nodes.LibraryNode):
            # an Einsum's backward adds its product into the gradient (a BLAS call with beta 1)
            full = dace.subsets.Range.from_array(self.sdfg.arrays[name])
            if edge.data.wcr is None or edge.data.dynamic or not edge.data.subset.covers(full):
                return False
            edge.data.wcr = None
            return True
        inner, exit_node = path[0], path[-1].src
        if len(path) != 2 or not isinstance(exit_node, nodes.MapExit):
            return False
        if state.entry_node(state.entry_node(exit_node)) is not None:  # a map nested in another
            return False
        if inner.data.wcr is None or inner.data.dynamic or inner.data.subset.num_elements() != 1:
            return False
        params = exit_node.map.params
        indices = [str(begin) for begin, _, _ in inner.data.subset.ndrange()]
        shape = self.sdfg.arrays[name].shape
        ranges = exit_node.map.range.ndrange()
        if sorted(indices) != sorted(params) or len(params) != len(shape):
            return False
        by_param = dict(zip(params, ranges))
        if not all(by_param[i] == (0, size - 1, 1) for i, size in zip(indices, shape)):
            return False
        for e in path:
            e.data.wcr = None
        return True

    def sole_write(self, name: str) -> tuple[nodes.AccessNode, object] | None:
        """(access node, edge) of the only write into ``name``, where the SDFG has one access node of it, read only
        from that node after the write; else None."""
        found = self._single_writer(name, read_after=True)
        return None if found is None else (found[1].dst, found[1])

    def overwritten(self, name: str) -> bool:
        """Whether the SDFG writes every element of ``name`` without reading or accumulating into it."""
        found = self._single_writer(name)
        if found is None:
            return False
        state, edge = found
        path = state.memlet_path(edge)
        if any(e.data.wcr is not None or e.data.dynamic for e in path):
            return False
        desc = self.sdfg.arrays[name]
        if len(path) == 1:
            return edge.data.subset.covers(dace.subsets.Range.from_array(desc))
        if any(not isinstance(e.dst, nodes.MapExit) for e in path[:-1]):
            return False
        # from the map's range and the inner memlet: DaCe's Vectorization leaves the outer memlet wrong
        if len(path) == 2:
            return _tiles_cover(path[0].data.subset, edge.src.map, desc.shape)
        return rows_cover(path[0].data.subset, [e.dst.map for e in path[:-1]], desc.shape)

    def _single_writer(self, name: str, read_after: bool = False) -> tuple[dace.SDFGState, object] | None:
        """(state, edge) of the only write into ``name`` when the SDFG has one access node of it and never reads it
        (or, ``read_after``, reads it only from that node, after the write)."""
        found = self.nodes.get(name, ())
        if len(found) != 1:
            return None
        node, state = found[0]
        if (state.out_degree(node) and not read_after) or state.in_degree(node) != 1 or state.sdfg is not self.sdfg:
            return None
        return state, state.in_edges(node)[0]


def _tiles_cover(subset, scope: nodes.Map, shape) -> bool:
    """Whether a map whose every dimension indexes one array dimension (a tile per iteration) writes all of it."""
    ranges = dict(zip(scope.params, scope.range.ndrange()))
    used = set()
    for (begin, end, step), size in zip(subset.ndrange(), shape):
        param = str(begin)
        if step != 1 or param not in ranges or param in used:
            return False
        used.add(param)
        length = dace.symbolic.simplify(end - begin + 1)
        first, last, stride = ranges[param]
        try:
            if not (first == 0 and length.is_Integer and bool(stride <= length) and bool(last + length >= size)):
                return False
        except TypeError:  # symbolic sizes: cannot tell, so the caller zeroes
            return False
    return used == set(scope.params)


def rows_cover(subset, scopes: list[nodes.Map], shape) -> bool:
    """Whether nested maps (innermost first) whose parameters each index one array dimension write all of it: an
    inner parameter may run over a tile that an outer parameter moves along (fuse_rows' chunks of rows), provided
    the tiles leave no gap."""
    ranges = {p: r for scope in scopes for p, r in zip(scope.params, scope.range.ndrange())}
    used = set()
    for (begin, end, _), size in zip(subset.ndrange(), shape):
        param = str(begin)
        if param not in ranges:
            if begin != 0 or end != size - 1:
                return False
            continue
        if begin != end or param in used:
            return False
        used.add(param)
        if not _covers(ranges[param], size, ranges):
            return False
    return True


def _covers(rng, size, ranges) -> bool:
    """Whether a parameter's range, over every value of the outer parameter it may depend on, is 0..size-1."""
    first, last, stride = rng
    if stride != 1:
        return False
    outer = {str(s) for s in dace.symbolic.pystr_to_symbolic(first).free_symbols | dace.symbolic.pystr_to_symbolic(last).free_symbols}
    if not outer:
        return first == 0 and last == size - 1
    if len(outer) != 1 or next(iter(outer)) not in ranges:
        return False
    name = next(iter(outer))
    q = dace.symbolic.symbol(name)
    q_first, q_last, q_stride = ranges[name]
    if q_stride != 1 or q_first != 0 or dace.symbolic.pystr_to_symbolic(q_last).free_symbols:
        return False
    first, last = dace.symbolic.pystr_to_symbolic(first), dace.symbolic.pystr_to_symbolic(last)
    gapless = dace.symbolic.simplify(last + 1 - first.subs(q, q + 1)) == 0
    return gapless and first.subs(q, 0) == 0 and last.subs(q, q_last) == size - 1
