"""Before autodiff, on the copy of the forward SDFG about to be differentiated."""

from __future__ import annotations

import copy

import dace
from dace import data as dt
from dace import subsets
from dace.sdfg import nodes
from dace.sdfg import utils as sdutil


def split_shared_map_inputs(sdfg: dace.SDFG) -> int:
    """Give every reader inside a map its own map-entry connector; returns how many were split.

    gap: simplify merges a map's duplicate inputs (``y * y`` reads ``y`` through one connector), and DaCe's data
    forwarding then adds that connector to the backward map twice and asserts (``assert added``).
    """
    split = 0
    changed = True
    while changed:
        changed = False
        for state in (s for g in sdfg.all_sdfgs_recursive() for s in g.states()):
            for entry in [n for n in state.nodes() if isinstance(n, nodes.MapEntry)]:
                for out_conn in [c for c in entry.out_connectors if c.startswith("OUT_")]:
                    readers = list(state.out_edges_by_connector(entry, out_conn))
                    if len(readers) < 2:
                        continue
                    [feed] = state.in_edges_by_connector(entry, "IN_" + out_conn[4:])
                    for edge in readers[1:]:
                        name = entry.next_connector(out_conn[4:])
                        entry.add_in_connector("IN_" + name)
                        entry.add_out_connector("OUT_" + name)
                        state.add_edge(feed.src, feed.src_conn, entry, "IN_" + name, copy.deepcopy(feed.data))
                        state.add_edge(entry, "OUT_" + name, edge.dst, edge.dst_conn, copy.deepcopy(edge.data))
                        state.remove_edge(edge)
                        split += 1
                    changed = True
    return split


def whole_arrays_for_ops(sdfg: dace.SDFG) -> int:
    """Give every library node (ONNX ops, and the Reduce their import expands ReduceMean to) whole arrays: where one
    reads or writes part of an array (a slice that simplification made a memlet's subset), the part is copied through
    a transient of its own; returns how many were.

    gap: DaCe's backward rules (and dcnb's) describe an op's gradients with its arrays' descriptors, so the sum of
    ``x[1:]`` made a gradient of x's shape for a part of x's: an invalid backward SDFG (BEiT's mean of its patch
    tokens, through DaCe's Reduce).
    """
    copied = 0
    for state in (s for g in sdfg.all_sdfgs_recursive() for s in g.states()):
        g = state.sdfg
        for node in [n for n in state.nodes() if isinstance(n, nodes.LibraryNode)]:
            for edge in [*state.in_edges(node), *state.out_edges(node)]:
                outer = edge.src if edge.dst is node else edge.dst
                if not isinstance(outer, nodes.AccessNode) or edge.data.is_empty():
                    continue
                viewed = _part_viewed(state, outer, written=edge.src is node)
                if viewed is not None:
                    _copy_instead_of_view(state, outer, viewed)
                    copied += 1
                    continue
                desc, subset = g.arrays[edge.data.data], edge.data.subset
                if subset.covers(subsets.Range.from_array(desc)):
                    continue
                name, part = g.add_transient(
                    f"{edge.data.data}_part", subset.size_exact(), desc.dtype, storage=desc.storage,
                    find_new_name=True,
                )
                access = state.add_access(name)
                whole = dace.Memlet.from_array(name, part)
                if edge.dst is node:
                    state.add_edge(outer, edge.src_conn, access, None, dace.Memlet(
                        data=edge.data.data, subset=copy.deepcopy(subset), other_subset=copy.deepcopy(whole.subset)))
                    state.add_edge(access, None, node, edge.dst_conn, whole)
                else:
                    state.add_edge(node, edge.src_conn, access, None, whole)
                    state.add_edge(access, None, outer, edge.dst_conn, dace.Memlet(
                        data=edge.data.data, subset=copy.deepcopy(subset), other_subset=copy.deepcopy(whole.subset),
                        wcr=edge.data.wcr))
                state.remove_edge(edge)
                copied += 1
    return copied


def _part_viewed(state: dace.SDFGState, node: nodes.AccessNode, written: bool):
    """The edge to the array ``node`` views, where ``node`` is a View of part of it
    (``x.view(b, 2, 2, c)[:, :1, :1].reshape(b, -1, c)``), an array from outside with axes of size 1 added or
    dropped (``x.unsqueeze(0)`` of an input), or ``written`` by an op (``sigmoid(x)[:, :, None]``, which
    simplification made the Sigmoid write into the Unsqueeze's array); None otherwise."""
    if not isinstance(state.sdfg.arrays[node.data], dt.View):
        return None
    edge = sdutil.get_view_edge(state, node)
    if edge is None or written:
        return edge
    viewed = edge.src if edge.dst is node else edge.dst
    subset = edge.data.get_src_subset(edge, state) if edge.dst is node else edge.data.get_dst_subset(edge, state)
    desc, view = state.sdfg.arrays[viewed.data], state.sdfg.arrays[node.data]
    if not desc.transient and _unit_axes_apart(view) == _unit_axes_apart(desc):
        return edge
    return edge if subset is not None and not subset.covers(subsets.Range.from_array(desc)) else None


def _unit_axes_apart(desc: dt.Data) -> list:
    """The sizes and strides of ``desc``'s axes but those of size 1: equal for a squeeze, not for a transpose."""
    return [(size, stride) for size, stride in zip(desc.shape, desc.strides) if size != 1]


def _copy_instead_of_view(state: dace.SDFGState, node: nodes.AccessNode, edge) -> None:
    """Make the View ``node`` an array of its own, copied from (or into) the part it viewed through ``edge``: by a
    map, element by element, where the part's axes of more than one element are the view's, else by ``edge``.

    gap: DaCe's autodiff passes a view an op's backward reads to the backward SDFG without the array it views: an
    invalid backward SDFG, for views of a part (LeViT's subsampled queries), of inputs (``x.unsqueeze(0) @ w``) and
    of an op's output its backward reads (a squeeze-and-excitation's gate, ``sigmoid(fc(pooled))[:, :, None, None]``).
    gap: DaCe's simplify makes an array copied into part of a larger one of another rank a View of it with the
    strides of a whole array (LeViT's ``x.view(b, 2, 2, c)[:, ::2, ::2]``: its gradient went to the wrong rows);
    a map it leaves as it is."""
    sdfg = state.sdfg
    view = sdfg.arrays[node.data]
    sdfg.arrays[node.data] = dt.Array(view.dtype, view.shape, transient=True, storage=view.storage)
    reading = edge.dst is node
    if reading:
        edge.dst_conn = None
        node.remove_in_connector("views")
    else:
        edge.src_conn = None
        node.remove_out_connector("views")
    viewed = edge.src if reading else edge.dst
    part = edge.data.get_src_subset(edge, state) if reading else edge.data.get_dst_subset(edge, state)
    # the part's axes of more than one element, in order, as the view's: their sizes, and their strides in the view
    strides = sdfg.arrays[viewed.data].strides
    moved = [(n, step * stride) for (_, _, step), n, stride in zip(part.ranges, part.size(), strides) if n != 1]
    if not view.shape or moved != [(n, stride) for n, stride in zip(view.shape, view.strides) if n != 1]:
        return
    params = [f"__i{k}" for k in range(len(view.shape))]
    moving = iter(p for p, n in zip(params, view.shape) if n != 1)
    index = [
        str(first) if size == 1 else f"{first} + {step} * {next(moving)}"
        for (first, _, step), size in zip(part.ranges, part.size())
    ]
    whole = dace.Memlet(data=node.data, subset=", ".join(params))
    piece = dace.Memlet(data=viewed.data, subset=", ".join(index), wcr=None if reading else edge.data.wcr)
    state.remove_edge(edge)
    state.add_mapped_tasklet(
        f"copy_{node.data}",
        {p: f"0:{n}" for p, n in zip(params, view.shape)},
        {"__in": piece if reading else whole},
        "__out = __in",
        {"__out": whole if reading else piece},
        input_nodes={viewed.data: viewed} if reading else {node.data: node},
        output_nodes={node.data: node} if reading else {viewed.data: viewed},
        external_edges=True,
    )
