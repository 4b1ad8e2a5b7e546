"""Column sums folded into the row map: each chunk of rows adds its rows into a partial sum of its own.

A norm's weight and bias gradients are sums over all rows of a value the backward's row map computes or reads
(dY * x_hat, dY). Summed after the row map, that value makes a round trip through memory: the row map writes it
in full (for LayerNorm 16x256x768, 12.6 MB, allocated on every call) and the column sum reads it back. A
hand-written kernel (PyTorch's among them) sums as it goes, into per-thread buffers. Here the row map is split
into chunks of rows, a parallel map over the chunks around a sequential one over each chunk's rows, and each
chunk adds its rows into its own row of a small ``partials`` array (chunks x columns); the column sum then reduces
``partials``. No chunk writes another's partial sums, so the adds need no atomics.
"""

from __future__ import annotations

import math

import dace
from dace import dtypes
from dace.libraries.standard import Reduce
from dace.sdfg import nodes
from dace.sdfg.state import SDFGState
from dace.transformation.dataflow import StripMining

from ..fixes import reduce_node

#: chunks the row map is split into at most: enough to balance the threads, few enough that partials stay small
CHUNKS = 64
#: chunks enough to keep the threads of a small machine busy
MIN_CHUNKS = 8
#: rows each chunk must have at least, or partial sums would move as much memory as the value they replace
MIN_ROWS_PER_CHUNK = 4


def fold(sdfg: dace.SDFG) -> int:
    """Fold every column sum over what a top-level row map writes or reads into that map; the number folded."""
    folded = 0
    for state in sdfg.states():
        by_map: dict[nodes.MapEntry, list[Reduce]] = {}
        for node in state.nodes():
            if isinstance(node, Reduce) and reduce_node.is_column_sum(node, state):
                entry = _row_map(state, node)
                if entry is not None:
                    by_map.setdefault(entry, []).append(node)
        for entry, sums in by_map.items():
            chunks = _chunks(entry)
            if chunks is None:
                continue
            written = [_written_by(state, entry, r) for r in sums]
            outer = _split(sdfg, state, entry, *chunks)
            for reduce, source in zip(sums, written):
                _into_partials(sdfg, state, outer, reduce, source, chunks[1])
                folded += 1
    return folded


def _row_map(state: SDFGState, reduce: Reduce) -> nodes.MapEntry | None:
    """The top-level map over exactly the rows of what ``reduce`` sums that writes it (alone) or reads it."""
    source = state.in_edges(reduce)[0].src
    if not isinstance(source, nodes.AccessNode):
        return None
    sdfg = state.sdfg
    rows = sdfg.arrays[source.data].shape[:-1]
    writers = state.in_edges(source)
    if writers:
        if len(writers) != 1 or state.out_degree(source) != 1 or not isinstance(writers[0].src, nodes.MapExit):
            return None
        if not sdfg.arrays[source.data].transient or _accesses(sdfg, source.data) != 1:
            return None
        entry = state.entry_node(writers[0].src)
        inner = [e for e in state.in_edges(writers[0].src) if e.dst_conn == "IN" + writers[0].src_conn[3:]]
        return entry if _over_rows(state, entry, rows) and _per_row(inner, entry) else None
    for entry in state.nodes():
        if isinstance(entry, nodes.MapEntry) and _over_rows(state, entry, rows):
            reads = [e for e in state.in_edges(entry) if e.data.data == source.data]
            if reads and all(_per_row(state.out_edges_by_connector(entry, "OUT" + e.dst_conn[2:]), entry) for e in reads):
                return entry
    return None


def _accesses(sdfg: dace.SDFG, data: str) -> int:
    return sum(1 for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nodes.AccessNode) and n.data == data)


def _over_rows(state: SDFGState, entry: nodes.MapEntry, rows) -> bool:
    """``entry`` is a top-level parallel map whose parameters run over ``rows``, one each, from 0."""
    if state.entry_node(entry) is not None or entry.map.schedule == dtypes.ScheduleType.Sequential:
        return False
    ranges = entry.map.range
    return len(ranges) == len(rows) and all(r == (0, n - 1, 1) for r, n in zip(ranges, rows))


def _per_row(edges, entry: nodes.MapEntry) -> bool:
    """Every edge moves one whole row: the map's parameters as the leading indices, all of the last axis."""
    params = [dace.symbolic.pystr_to_symbolic(p) for p in entry.map.params]
    for edge in edges:
        subset = edge.data.subset
        if len(subset) != len(params) + 1:
            return False
        if any(r != (p, p, 1) for r, p in zip(subset, params)):
            return False
    return bool(edges)


def _chunks(entry: nodes.MapEntry) -> tuple[int, int] | None:
    """(row dimension to split, chunks): the outermost dimension with at least MIN_CHUNKS rows, else the largest,
    into at most CHUNKS chunks. Splitting an outer dimension keeps each chunk's rows together in memory, which the
    hardware prefetcher needs (chunks of an inner one made LayerNorm's backward 2x slower)."""
    sizes = [int(r[1]) + 1 for r in entry.map.range]
    dim = next((i for i, n in enumerate(sizes) if n >= MIN_CHUNKS), sizes.index(max(sizes)))
    count = max(d for d in range(1, min(CHUNKS, sizes[dim]) + 1) if sizes[dim] % d == 0)
    if count < 2 or math.prod(sizes) // count < MIN_ROWS_PER_CHUNK:
        return None
    return dim, count


def _written_by(state: SDFGState, entry: nodes.MapEntry, reduce: Reduce) -> nodes.AccessNode:
    """The access node ``reduce`` sums, written by the row map: where the map only reads it, the map gets a loop
    copying each row out, so that both cases fold alike."""
    source = state.in_edges(reduce)[0].src
    if state.in_degree(source):
        return source
    sdfg = state.sdfg
    desc = sdfg.arrays[source.data]
    name, _ = sdfg.add_transient(f"{source.data}_rows", desc.shape, desc.dtype, find_new_name=True)
    row = ", ".join(entry.map.params)
    copy_entry, copy_exit = state.add_map("copy_row", {"_fc": f"0:{desc.shape[-1]}"}, dtypes.ScheduleType.Sequential)
    tasklet = state.add_tasklet("copy", {"i"}, {"o"}, "o = i")
    state.add_memlet_path(
        source, entry, copy_entry, tasklet, dst_conn="i", memlet=dace.Memlet(f"{source.data}[{row}, _fc]")
    )
    copied = state.add_access(name)
    state.add_memlet_path(
        tasklet, copy_exit, state.exit_node(entry), copied, src_conn="o", memlet=dace.Memlet(f"{name}[{row}, _fc]")
    )
    old = state.in_edges(reduce)[0]
    state.remove_edge(old)
    state.add_edge(copied, None, reduce, old.dst_conn, dace.Memlet.from_array(name, sdfg.arrays[name]))
    return copied


def _split(sdfg: dace.SDFG, state: SDFGState, entry: nodes.MapEntry, dim: int, count: int) -> nodes.MapEntry:
    """Split the row map into a parallel map over ``count`` chunks around a sequential map over their rows."""
    StripMining.apply_to(
        sdfg,
        options=dict(
            dim_idx=dim,
            tile_size=count,
            tiling_type=dtypes.TilingType.NumberOfTiles,
            divides_evenly=True,
            new_dim_prefix="chunk",
        ),
        map_entry=entry,
    )
    return state.entry_node(entry)


def _into_partials(
    sdfg: dace.SDFG, state: SDFGState, outer: nodes.MapEntry, reduce: Reduce, source: nodes.AccessNode, count: int
) -> None:
    """Write what ``reduce`` sums into per-chunk partial sums (adding), and have ``reduce`` sum those instead."""
    desc = sdfg.arrays[source.data]
    name, _ = sdfg.add_transient(f"{source.data}_partials", (count, desc.shape[-1]), desc.dtype, find_new_name=True)
    chunk = dace.symbolic.pystr_to_symbolic(outer.map.params[0])
    outer_exit = state.exit_node(outer)
    last = state.in_edges(source)[0]
    for edge in state.memlet_path(last):
        columns = edge.data.subset[-1]
        first = (0, count - 1, 1) if edge is last else (chunk, chunk, 1)
        edge.data = dace.Memlet(data=name, subset=dace.subsets.Range([first, columns]), wcr=reduce.wcr)
    assert last.src is outer_exit
    replaced = source.data
    source.data = name
    source.setzero = True  # each chunk's sums start from zero, the identity of a sum
    state.out_edges(source)[0].data = dace.Memlet.from_array(name, sdfg.arrays[name])
    reduce.axes = [0]
    if _accesses(sdfg, replaced) == 0:
        sdfg.remove_data(replaced)
