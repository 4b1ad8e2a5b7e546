"""Reductions as a hand-written CPU kernel has them: two expansions of DaCe's Reduce library node.

DaCe's own expansions reduce with atomics ("pure") or with a sequential loop per output element ("pure-seq").
The loop per element is right for the work but wrong for the machine in the two reductions a softmax or a norm
needs:

- along each row (a maximum over the last axis): the loop carries its accumulator from one element to the next,
  and GCC vectorizes a maximum only where it may also assume no NaN, which no flag of ours allows. RowReduction
  emits the loop with ``#pragma omp simd reduction``: reassociation for this loop only, as OpenMP defines it, so
  the row is reduced a vector at a time. Sums along a row keep DaCe's loop: the build lets GCC reassociate sums
  (build.py), and as a map that loop can fuse into the one computing its terms (actions/rows.py).
- down each column (a norm's weight and bias gradients: a sum over all rows per feature; a scale's gradient
  over each channels-last image: a sum over its pixels per channel): one loop per column strides a whole row
  between elements. ColumnSums walks the rows in order with a tile of columns innermost, one tile per thread, so
  memory is read in order and the inner loop vectorizes without reassociating.

Sums accumulate in a wider type than their terms (float32 in float64), as PyTorch's do (pairwise or in a wider
type): added one after another in float32, a BatchNorm's mean over a batch of 224x224 images (25,088 terms per
channel) was 20-40x further from the exact value than PyTorch's, and across a full-size network that flipped ReLU
masks where a pre-activation lay that close to zero, so that gradients came out wrong (a MobileNetV2 at
2x3x224x224: 2 of its last layer's 1280 bias gradients 0.019 off).
"""

from __future__ import annotations

import copy

import dace
from dace.frontend.operations import detect_reduction_type
from dace.libraries.standard import Reduce
from dace.library import register_expansion
from dace.libraries.standard.nodes.reduce import ExpandReducePureSequentialDim
from dace.sdfg import nodes
from dace.transformation.transformation import ExpandTransformation

from .. import dace_internals

#: columns a thread sums at a time at most: a few cache lines per row, read in order
COLUMN_TILE = 128
#: the fewest columns a tile may have for the column walk to pay
COLUMN_TILE_MIN = 16
#: the label of RowReduction's tasklet, whose C++ loop does one operation per element of its row (views/overlays.py)
ROW_TASKLET = "reduce_row"
#: reduction type -> (OpenMP reduction identifier, how one element updates the accumulator); sums stay DaCe's
_ROW_UPDATES = {
    dace.dtypes.ReductionType.Product: ("*", "acc * _row[i]"),
    dace.dtypes.ReductionType.Max: ("max", "(_row[i] > acc ? _row[i] : acc)"),
    dace.dtypes.ReductionType.Min: ("min", "(_row[i] < acc ? _row[i] : acc)"),
}


#: the type a sum of terms of a type accumulates in, where a wider one is needed
WIDER = {dace.float32: dace.float64, dace.float16: dace.float32}


def implementation(node: Reduce, state: dace.SDFGState) -> str:
    """The expansion ``node`` should get: one of ours where it fits, else DaCe's atomics-free "pure-seq" with a
    wider accumulator for sums."""
    if _column_tile(node, state):
        return "dcnb-columns"
    if _row_update(node, state):  # not for sums (see above)
        return "dcnb-rows"
    return "dcnb-seq"


def on_gpu(node: Reduce, state: dace.SDFGState) -> str:
    """The expansion ``node`` gets on a GPU where DaCe's GPUAuto does not plan it: a loop per output element
    ("pure-seq") for a maximum, minimum or product with at least as many elements out as terms per element, else
    DaCe's "pure" (a thread per term, each adding into its element atomically: sums, and few elements out).

    gap: a float has no atomic maximum on a GPU; "pure"'s is a compare-and-swap loop, which the 128 threads of each
    row retry against each other: a softmax's maximum over rows of 128 took 362 us of a BERT-base layer's 2.3 ms
    of kernels on an H200, where a loop per row reads the 6 MB once."""
    if detect_reduction_type(node.wcr) == dace.dtypes.ReductionType.Sum:
        return "pure"
    inedge, outedge = state.in_edges(node)[0], state.out_edges(node)[0]
    try:
        terms, out = int(inedge.data.subset.num_elements()), int(outedge.data.subset.num_elements())
    except TypeError:
        return "pure"  # symbolic sizes
    return "pure-seq" if node.identity is not None and out * out >= terms else "pure"


def _accumulator(node: Reduce, dtype: dace.typeclass) -> dace.typeclass:
    """The type ``node``'s partial results are kept in: wider than its terms' for a sum."""
    is_sum = detect_reduction_type(node.wcr) == dace.dtypes.ReductionType.Sum
    return WIDER.get(dtype, dtype) if is_sum else dtype


def is_column_sum(node: Reduce, state: dace.SDFGState) -> bool:
    """Whether ``node`` sums a whole array over every axis but the last (into that axis' length)."""
    return _leading(node, state) == 0 and detect_reduction_type(node.wcr) == dace.dtypes.ReductionType.Sum


def _leading(node: Reduce, state: dace.SDFGState) -> int | None:
    """How many leading axes ``node`` keeps where it sums down columns, each of them apart: every axis from there
    on but the last, into the kept axes and the last (a batch of images' channels summed over their pixels, laid
    out channels-last); None where it reduces otherwise."""
    shapes = _shapes(node, state)
    if shapes is None:
        return None
    shape, out, axes = shapes
    lead = axes[0] if axes else None
    if lead is None or axes != list(range(lead, len(shape) - 1)) or out[-1] != shape[-1]:
        return None
    return lead if [s for s in out[:-1] if s != 1] == [s for s in shape[:lead] if s != 1] else None


def _shapes(node: Reduce, state: dace.SDFGState) -> tuple[list[int], list[int], list[int]] | None:
    """(input shape, output shape, reduced axes) where ``node`` reduces a whole array into a whole array of
    constant shape, its input contiguous along the last axis; else None."""
    inedge, outedge = state.in_edges(node)[0], state.out_edges(node)[0]
    arrays = state.sdfg.arrays
    if any(e.data.subset != dace.subsets.Range.from_array(arrays[e.data.data]) for e in (inedge, outedge)):
        return None
    try:
        shape = [int(s) for s in inedge.data.subset.size()]
        out = [int(s) for s in outedge.data.subset.size()]
    except TypeError:
        return None  # symbolic sizes
    if node.identity is None or len(shape) < 2 or arrays[inedge.data.data].strides[-1] != 1:
        return None
    axes = sorted(node.axes) if node.axes is not None else list(range(len(shape)))
    return shape, out, axes


def _column_tile(node: Reduce, state: dace.SDFGState) -> int | None:
    """Columns per tile where ``node`` sums down columns (``_leading``), else None."""
    if _leading(node, state) is None:
        return None
    shape = _shapes(node, state)[0]
    tile = max(d for d in range(1, min(COLUMN_TILE, shape[-1]) + 1) if shape[-1] % d == 0)
    return tile if tile >= COLUMN_TILE_MIN else None


def _row_update(node: Reduce, state: dace.SDFGState) -> tuple[str, str] | None:
    """(OpenMP reduction, update) where ``node`` reduces over the last axis only with an operator OpenMP knows."""
    shapes = _shapes(node, state)
    if shapes is None:
        return None
    shape, out, axes = shapes
    if axes != [len(shape) - 1] or [s for s in out if s != 1] != [s for s in shape[:-1] if s != 1]:
        return None
    return _ROW_UPDATES.get(detect_reduction_type(node.wcr))


def _nested(node: Reduce, state: dace.SDFGState, sdfg: dace.SDFG, name: str) -> dace.SDFG:
    """An empty nested SDFG holding the node's input as ``_in`` and its output as ``_out`` (absolute memlets)."""
    nsdfg = dace.SDFG(name)
    for connector, edge in (("_in", state.in_edges(node)[0]), ("_out", state.out_edges(node)[0])):
        nsdfg.add_datadesc(connector, copy.deepcopy(sdfg.arrays[edge.data.data]))
        nsdfg.arrays[connector].transient = False
    dace_internals.rename_connectors(state, node, into="_in", out_of="_out")
    node.add_in_connector("_in")
    node.add_out_connector("_out")
    return nsdfg


def _output_index(out: list[int], params: list[str]) -> str:
    """Index of the output element of ``params`` (one per kept axis, in order; kept axes of length 1 drop out)."""
    kept = iter(params)
    return ", ".join("0" if size == 1 else next(kept) for size in out)


@register_expansion(Reduce, "dcnb-rows")
class RowReduction(ExpandTransformation):
    """A map over the rows around one tasklet that reduces its row in a ``#pragma omp simd reduction`` loop."""

    environments = []

    @staticmethod
    def expansion(node: Reduce, state: dace.SDFGState, sdfg: dace.SDFG) -> dace.SDFG:
        shape, out, _ = _shapes(node, state)
        omp, update = _row_update(node, state)
        dtype = sdfg.arrays[state.in_edges(node)[0].data.data].dtype
        nsdfg = _nested(node, state, sdfg, "reduce_rows")
        params = [f"_r{i}" for i in range(len(shape) - 1)]
        body = nsdfg.add_state("reduce")
        entry, exit_ = body.add_map("rows", {p: f"0:{n}" for p, n in zip(params, shape)})
        tasklet = body.add_tasklet(
            ROW_TASKLET,
            {"_row": dace.pointer(dtype)},
            {"_o": dtype},
            f"{dtype.ctype} acc = {dtype.ctype}({node.identity});\n"
            f"#pragma omp simd reduction({omp}:acc)\n"
            f"for (int i = 0; i < {shape[-1]}; ++i) acc = {update};\n"
            "_o = acc;",
            language=dace.Language.CPP,
        )
        index = _output_index(out, [p for p, n in zip(params, shape) if n != 1])
        row = dace.Memlet(f"_in[{', '.join(params)}, 0:{shape[-1]}]")
        body.add_memlet_path(body.add_read("_in"), entry, tasklet, dst_conn="_row", memlet=row)
        body.add_memlet_path(
            tasklet, exit_, body.add_write("_out"), src_conn="_o", memlet=dace.Memlet(f"_out[{index}]")
        )
        return nsdfg


@register_expansion(Reduce, "dcnb-columns")
class ColumnSums(ExpandTransformation):
    """A parallel map over tiles of columns (and the kept leading indices) around a sequential walk over the rows,
    the tile's columns innermost, into sums of the wider type, then a walk over the tile writing them out."""

    environments = []

    @staticmethod
    def expansion(node: Reduce, state: dace.SDFGState, sdfg: dace.SDFG) -> dace.SDFG:
        shape, out, _ = _shapes(node, state)
        tile, lead = _column_tile(node, state), _leading(node, state)
        dtype = sdfg.arrays[state.in_edges(node)[0].data.data].dtype
        nsdfg = _nested(node, state, sdfg, "reduce_columns")
        # a tile's sums per kept leading index: those go in parallel too
        nsdfg.add_transient("_acc", [*shape[:lead], shape[-1]], _accumulator(node, dtype))
        kept = [f"_k{i}" for i in range(lead)]
        acc = f"_acc[{', '.join([*kept, '_c'])}]"
        rows = [f"_r{i}" for i in range(lead, len(shape) - 1)]
        # one state, so that the parent state stays one once this is inlined and the maps around it can fuse
        body = nsdfg.add_state("sum")
        tiles = {k: f"0:{n}" for k, n in zip(kept, shape)} | {"_t": f"0:{shape[-1] // tile}"}
        tiles_entry, tiles_exit = body.add_map("column_tiles", tiles)
        columns = f"_t * {tile}:_t * {tile} + {tile}"
        reset_entry, reset_exit = body.add_map("reset", {"_c": columns}, schedule=dace.ScheduleType.Sequential)
        reset = body.add_tasklet("reset", {}, {"o"}, f"o = {node.identity}")
        body.add_nedge(tiles_entry, reset_entry, dace.Memlet())
        body.add_nedge(reset_entry, reset, dace.Memlet())
        zeroed = body.add_access("_acc")
        body.add_memlet_path(reset, reset_exit, zeroed, src_conn="o", memlet=dace.Memlet(acc))
        ranges = {r: f"0:{n}" for r, n in zip(rows, shape[lead:])} | {"_c": columns}
        rows_entry, rows_exit = body.add_map("rows", ranges, schedule=dace.ScheduleType.Sequential)
        # reads the reset tile ("a", unused) so that the sums start after it
        add = body.add_tasklet("add", {"a", "b"}, {"o"}, "o = b")
        body.add_memlet_path(zeroed, rows_entry, add, dst_conn="a", memlet=dace.Memlet(acc))
        element = dace.Memlet(f"_in[{', '.join([*kept, *rows, '_c'])}]")
        body.add_memlet_path(body.add_read("_in"), tiles_entry, rows_entry, add, dst_conn="b", memlet=element)
        summed = body.add_access("_acc")
        body.add_memlet_path(add, rows_exit, summed, src_conn="o", memlet=dace.Memlet(acc, wcr=node.wcr))
        out_entry, out_exit = body.add_map("write", {"_c": columns}, schedule=dace.ScheduleType.Sequential)
        write = body.add_tasklet("write", {"a"}, {"o"}, "o = a")
        body.add_memlet_path(summed, out_entry, write, dst_conn="a", memlet=dace.Memlet(acc))
        index = _output_index(out, [k for k, n in zip(kept, shape) if n != 1] + ["_c"])
        total = dace.Memlet(f"_out[{index}]")
        body.add_memlet_path(write, out_exit, tiles_exit, body.add_write("_out"), src_conn="o", memlet=total)
        return nsdfg


@register_expansion(Reduce, "dcnb-seq")
class SequentialReduction(ExpandTransformation):
    """DaCe's "pure-seq" (a map over the output elements around a sequential loop over what each reduces), its
    accumulator of the wider type for sums, converted as it is written out."""

    environments = []

    @staticmethod
    def expansion(node: Reduce, state: dace.SDFGState, sdfg: dace.SDFG) -> dace.SDFG:
        dtype = sdfg.arrays[state.in_edges(node)[0].data.data].dtype
        wider = _accumulator(node, dtype)
        nsdfg = ExpandReducePureSequentialDim.expansion(node, state, sdfg)
        if wider == dtype or "acc" not in nsdfg.arrays:  # (no accumulator: a reduction over nothing, a copy)
            return nsdfg
        nsdfg.arrays["acc"].dtype = wider
        for body in nsdfg.states():
            for edge in list(body.edges()):
                written_out = isinstance(edge.src, nodes.AccessNode) and isinstance(edge.dst, nodes.MapExit)
                if written_out and edge.src.data == "acc":
                    # acc -> _out is a copy, which must not convert: a tasklet converts
                    write = body.add_tasklet("write", {"a"}, {"o"}, "o = a")
                    body.remove_edge(edge)
                    body.add_edge(edge.src, None, write, "a", dace.Memlet("acc[0]"))
                    target = edge.data.other_subset if edge.data.data == "acc" else edge.data.subset
                    body.add_edge(write, "o", edge.dst, edge.dst_conn, dace.Memlet(data="_out", subset=target))
        return nsdfg
