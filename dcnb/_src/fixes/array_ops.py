"""Array ops: Expand (broadcasting to a shape), Slice, Split, Gather from an axis of length 1, the gathers Pad,
GatherElements, Tile, DepthToSpace, SpaceToDepth and Trilu (C++ loops, with a backward that adds each output's
gradient into the element it read), and the scatters ScatterND and ScatterElements."""

from __future__ import annotations

import copy
from collections.abc import Callable

import dace
from dace import data as dt
from dace import subsets
from dace.autodiff.base_abc import BackwardImplementation
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.libraries.onnx.op_implementations.array_ops import PureGather
from dace.registry import autoregister_params
from dace.sdfg.utils import in_desc_with_name, out_desc_with_name
from dace.transformation.onnx import constant_folding
from dace.transformation.onnx.replacement import onnx_constant_or_none

from .. import dace_internals
from .cpp import (
    at,
    cpp_backward,
    cpp_expansion,
    forward_in,
    forward_out,
    loops,
    memory_loops,
    offset,
    zero,
)
from .registry import default_backward, op_versions, pure_expansion


def broadcast_index(desc: dt.Data, out_shape: list, out_index: list[str]) -> list[str]:
    """The index into ``desc`` that numpy-style broadcasting reads for output element ``out_index``."""
    if isinstance(desc, dt.Scalar):
        return []
    offset = len(out_shape) - len(desc.shape)
    return ["0" if int(size) == 1 else out_index[offset + i] for i, size in enumerate(desc.shape)]


@pure_expansion("Expand", name="dcnb")
class ExpandExpansion(ONNXForward):
    # gap: DaCe registers two "pure" Expands under one name, so only the one for an unchanged shape remains, and the
    # other assigns to a local name instead of the output: every broadcasting Expand (``cls_token.expand(n, -1,
    # -1)``, and ReduceSum's backward rule) failed to generate code ("Node expansion must be a CodeNode or an SDFG")
    @staticmethod
    def forward(node, state, sdfg):
        x = copy.deepcopy(in_desc_with_name(node, state, sdfg, "input"))
        y = copy.deepcopy(out_desc_with_name(node, state, sdfg, "output"))
        # the target shape is in the output's descriptor: its input and what computes it are not needed
        constant_folding.remove_node_and_computation(sdfg, state, node, "shape")
        return _copy_sdfg(
            node, "broadcast", {"input": x, "output": y}, lambda out: broadcast_index(x, list(y.shape), out)
        )


def _copy_sdfg(node, what: str, arrays: dict[str, dt.Data], read: Callable[[list[str]], list[str]]) -> dace.SDFG:
    """``node``'s expansion, with ``arrays`` (the first read, the last written), that copies into each element of the
    last the element ``read(index)`` of the first (a map named ``what``)."""
    nsdfg = dace.SDFG(f"{node.label}_expansion")
    for name, desc in arrays.items():
        nsdfg.add_datadesc(name, copy.deepcopy(desc))
        nsdfg.arrays[name].transient = False
    names = list(arrays)
    source, target, shape = names[0], names[-1], arrays[names[-1]].shape
    params = [f"__i{d}" for d in range(len(shape))]
    nsdfg.add_state().add_mapped_tasklet(
        f"{node.label}_{what}",
        {p: f"0:{n}" for p, n in zip(params, shape)},
        {"__in": dace.Memlet(f"{source}[{', '.join(read(params)) or '0'}]")},
        "__out = __in",
        {"__out": dace.Memlet(f"{target}[{', '.join(params)}]")},
        external_edges=True,
    )
    return nsdfg


def constant_input(node, state, sdfg: dace.SDFG, connector: str) -> list | None:
    """The values of the ONNX constant that feeds ``connector`` of ``node`` as a flat list; None where nothing
    feeds it or what does is computed."""
    edges = list(state.in_edges_by_connector(node, connector))
    root = dace_internals.onnx_root(sdfg)
    if not edges or root is None:
        return None
    value = onnx_constant_or_none(root, edges[0].src.data)
    if value is None:
        return None
    if not isinstance(value, list):
        return [value]
    return [v for row in value for v in (row if isinstance(row, list) else [row])]


def _slice_ranges(node, state, sdfg, x: dt.Data) -> list[tuple[int, int]] | None:
    """(start, step) per dimension of a Slice with constant inputs, its starts normalized as ONNX says (negative
    ones count from the end, then clamped); None where an input is computed."""
    starts, ends = constant_input(node, state, sdfg, "starts"), constant_input(node, state, sdfg, "ends")
    axes = constant_input(node, state, sdfg, "axes") if "axes" in node.in_connectors else None
    steps = constant_input(node, state, sdfg, "steps") if "steps" in node.in_connectors else None
    if starts is None or ends is None or ("axes" in node.in_connectors and axes is None):
        return None
    if "steps" in node.in_connectors and steps is None:
        return None
    ranges = [(0, 1) for _ in x.shape]
    for axis, start, step in zip(axes or range(len(starts)), starts, steps or [1] * len(starts)):
        size = int(x.shape[axis])
        start = start + size if start < 0 else start
        # a forward slice may start at the end (empty), a backward one starts at the last element at most
        start = max(0, min(start, size if step > 0 else size - 1))
        ranges[axis] = (start, step)
    return ranges


@pure_expansion("Slice", name="dcnb")
class SliceExpansion(ONNXForward):
    # gap: DaCe's Slice takes negative starts as they are and cannot step backwards: torch.roll's x[..., -2:] and
    # torch.flip's x[..., ::-1] gave memlets out of bounds
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return _slice_ranges(node, state, sdfg, in_desc_with_name(node, state, sdfg, "data")) is not None

    @staticmethod
    def forward(node, state, sdfg):
        x = copy.deepcopy(in_desc_with_name(node, state, sdfg, "data"))
        y = copy.deepcopy(out_desc_with_name(node, state, sdfg, "output"))
        ranges = _slice_ranges(node, state, sdfg, x)
        for connector in ("starts", "ends", "axes", "steps"):
            constant_folding.remove_node_and_computation(sdfg, state, node, connector)
        nsdfg = dace.SDFG(f"{node.label}_expansion")
        for name, desc in (("data", x), ("output", y)):
            desc.transient = False
            nsdfg.add_datadesc(name, desc)
        nstate = nsdfg.add_state()
        if all(step > 0 for _, step in ranges):  # a strided copy, as DaCe's own Slice makes
            subset = subsets.Range([(s, s + step * (n - 1), step) for (s, step), n in zip(ranges, y.shape)])
            memlet = dace.Memlet(data="data", subset=subset, other_subset=subsets.Range.from_array(y))
            nstate.add_nedge(nstate.add_read("data"), nstate.add_write("output"), memlet)
            return nsdfg
        # a copy cannot run backwards: a map reading element start + step * i, whose backward autodiff derives
        params = [f"__i{i}" for i in range(len(y.shape))]
        read = ", ".join(f"{s} + ({step}) * {p}" for (s, step), p in zip(ranges, params))
        nstate.add_mapped_tasklet(
            f"{node.label}_map",
            {p: f"0:{n}" for p, n in zip(params, y.shape)},
            {"__in": dace.Memlet(f"data[{read}]")},
            "__out = __in",
            {"__out": dace.Memlet(f"output[{', '.join(params)}]")},
            external_edges=True,
        )
        return nsdfg


def _split_sizes(node, state, sdfg, x: dt.Data) -> list[int] | None:
    """The sizes of a Split's parts along its axis: its constant sizes' input, else its number of parts (each the
    size of the first, the last smaller, as ONNX says), else its outputs' shapes where all are connected."""
    axis = node.axis % len(x.shape)
    if "split" in node.in_connectors:
        return constant_input(node, state, sdfg, "split")
    if getattr(node, "num_outputs", None):
        size = -(-int(x.shape[axis]) // node.num_outputs)
        return [min(size, int(x.shape[axis]) - i * size) for i in range(node.num_outputs)]
    edges = {int(e.src_conn.rpartition("_")[2]): e for e in state.out_edges(node)}
    if sorted(edges) != list(range(len(edges))):
        return None
    return [int(sdfg.arrays[edges[i].data.data].shape[axis]) for i in range(len(edges))]


@pure_expansion("Split", name="dcnb")
class SplitExpansion(ONNXForward):
    # gap: DaCe's Split leaves the split sizes' array unconnected in its expansion (an invalid SDFG: x.split([3, 5]))
    # and compares dimensions with a negative axis as it is (every part of nn.GLU's split read the first half)
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return _split_sizes(node, state, sdfg, in_desc_with_name(node, state, sdfg, "input")) is not None

    @staticmethod
    def forward(node, state, sdfg):
        x = copy.deepcopy(in_desc_with_name(node, state, sdfg, "input"))
        axis = node.axis % len(x.shape)
        sizes = _split_sizes(node, state, sdfg, x)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        constant_folding.remove_node_and_computation(sdfg, state, node, "split")
        nsdfg = dace.SDFG(f"{node.label}_expansion")
        x.transient = False
        nsdfg.add_datadesc("input", x)
        nstate = nsdfg.add_state()
        read = nstate.add_read("input")
        for edge in state.out_edges(node):
            part = int(edge.src_conn.rpartition("_")[2])
            y = copy.deepcopy(sdfg.arrays[edge.data.data])
            y.transient = False
            nsdfg.add_datadesc(edge.src_conn, y)
            subset = subsets.Range(
                [
                    (starts[part], starts[part] + sizes[part] - 1, 1) if d == axis else (0, n - 1, 1)
                    for d, n in enumerate(x.shape)
                ]
            )
            memlet = dace.Memlet(data="input", subset=subset, other_subset=subsets.Range.from_array(y))
            nstate.add_nedge(read, nstate.add_write(edge.src_conn), memlet)
        return nsdfg


@pure_expansion("Gather", name="dcnb")
class GatherExpansion(ONNXForward):
    # gap: DaCe's Gather reads ``__data[idx]`` through a memlet over the whole axis, which DaCe takes for a single
    # element where the axis has length 1 (``x[0]`` of a batch of one; ConvBERT's span kernels): an invalid SDFG
    @staticmethod
    def forward(node, state, sdfg):
        x, y = in_desc_with_name(node, state, sdfg, "data"), out_desc_with_name(node, state, sdfg, "output")
        axis = node.axis % len(x.shape)
        if int(x.shape[axis]) != 1:
            return PureGather.forward(node, state, sdfg)
        # every index in range reads the axis' one element: a copy that repeats it along the indices' axes
        indices = in_desc_with_name(node, state, sdfg, "indices")
        after = len(y.shape) - (len(x.shape) - axis - 1)  # the output's axes after the indices' ones
        return _copy_sdfg(
            node, "repeat", {"data": x, "indices": indices, "output": y}, lambda out: [*out[:axis], "0", *out[after:]]
        )


#: a gather's source element for output element ``index``: (C++ declaring what it needs, the input's index, the
#: C++ condition under which it reads one, or None for always); its arguments: node, state, sdfg, x, y, index
Source = Callable[..., tuple[str, list[str], str | None]]


def _gather_loops(source: Source, node, state, sdfg, x: dt.Data, y: dt.Data, inside: str, outside: str = "") -> str:
    """C++ over every output element: ``inside`` where it reads an input element (both seen as ``Y[yi]`` and
    ``X[xi]`` through ``yi`` and ``xi``), ``outside`` where it does not."""
    index = [f"o{d}" for d in range(len(y.shape))]
    prelude, read, condition = source(node, state, sdfg, x, y, index)
    head, tail = memory_loops(index, y)
    body = prelude + f"const long long yi = {offset(y, index)};\n"
    if condition is None:
        return head + body + f"const long long xi = {offset(x, read)};\n" + inside + tail
    body += f"if ({condition}) {{\nconst long long xi = {offset(x, read)};\n{inside}}}"
    return head + body + (f" else {{\n{outside}}}\n" if outside else "\n") + tail


def _register(op: str, applies, forward, backward) -> None:
    """Register ``forward(node, state, sdfg)`` as the expansion of the ONNX op ``op`` and ``backward(forward_node,
    context, given_gradients, required_gradients)`` as its backward rule, both where ``applies(node, state, sdfg)``."""
    members = {"forward_can_be_applied": staticmethod(applies), "forward": staticmethod(forward)}
    pure_expansion(op)(type(f"{op}Expansion", (ONNXForward,), members))
    members = {"backward_can_be_applied": staticmethod(applies), "backward": staticmethod(backward)}
    autoregister_params(op=op, name="dcnb")(type(f"{op}Backward", (BackwardImplementation,), members))
    default_backward(op)


def _register_gather(
    op: str,
    source: Source,
    applies=lambda node, state, sdfg: True,
    fill: Callable[..., str] = lambda node: "0",
    reads: tuple[str, ...] = (),
) -> None:
    """Register the ONNX op ``op``, whose output element is the input element ``source`` names (or ``fill(node)``,
    C++ over the node's inputs, where it names none), and its backward: each output's gradient added into the element
    it read. Its data input and output are the op's first ones; ``reads`` names the other inputs ``source`` reads
    (their values, not only their shapes)."""
    schema = op_versions(op)[-1].schema
    x_name, y_name = schema.inputs[0].name, schema.outputs[0].name

    def forward(node, state, sdfg):
        x, y = in_desc_with_name(node, state, sdfg, x_name), out_desc_with_name(node, state, sdfg, y_name)
        inside, outside = f"{y_name}[yi] = {x_name}[xi];\n", f"{y_name}[yi] = {fill(node)};\n"
        return cpp_expansion(node, state, sdfg, _gather_loops(source, node, state, sdfg, x, y, inside, outside))

    def backward(forward_node, context, given_gradients, required_gradients):
        x, y = forward_in(forward_node, context, x_name), forward_out(forward_node, context, y_name)
        state, sdfg = context.forward_state, context.forward_sdfg
        body = zero(f"{x_name}_grad", x) + _gather_loops(
            source, forward_node, state, sdfg, x, y, f"{x_name}_grad[xi] += {y_name}_grad[yi];\n"
        )
        return cpp_backward(forward_node, context, [f"{y_name}_grad", *reads, f"{x_name}_grad"], body)

    _register(op, applies, forward, backward)


def _pads(node, state, sdfg, x: dt.Data) -> list[int] | None:
    """A Pad's constant pads as [begin..., end...] over all of ``x``'s dimensions (its axes input spread out)."""
    pads = constant_input(node, state, sdfg, "pads")
    axes = constant_input(node, state, sdfg, "axes") if "axes" in node.in_connectors else list(range(len(x.shape)))
    if pads is None or axes is None:
        return None
    rank, spread = len(x.shape), [0] * (2 * len(x.shape))
    for k, axis in enumerate(axes):
        spread[axis % rank], spread[axis % rank + rank] = pads[k], pads[k + len(axes)]
    return spread


def _pad_applies(node, state, sdfg) -> bool:
    x = in_desc_with_name(node, state, sdfg, "data")
    return node.mode in ("constant", "reflect", "edge") and _pads(node, state, sdfg, x) is not None


def _pad_source(node, state, sdfg, x: dt.Data, y: dt.Data, index: list[str]):
    pads = _pads(node, state, sdfg, x)
    prelude, read = "", []
    for d, (o, size) in enumerate(zip(index, x.shape)):
        prelude += f"long long s{d} = {o} - ({pads[d]});\n"
        if node.mode == "edge":
            prelude += f"s{d} = s{d} < 0 ? 0 : (s{d} >= {size} ? {size} - 1 : s{d});\n"
        elif node.mode == "reflect" and int(size) > 1:  # mirrored about the first and last element, periodically
            period = 2 * (int(size) - 1)
            prelude += f"s{d} = ((s{d} % {period}) + {period}) % {period};\n"
            prelude += f"s{d} = s{d} < {size} ? s{d} : {period} - s{d};\n"
        elif node.mode == "reflect":
            prelude += f"s{d} = 0;\n"
        read.append(f"s{d}")
    inside = " && ".join(f"s{d} >= 0 && s{d} < {size}" for d, size in enumerate(x.shape))
    return prelude, read, inside if node.mode == "constant" else None


def _pad_value(node) -> str:
    return "constant_value[0]" if "constant_value" in node.in_connectors else "0"


def _tile_source(node, state, sdfg, x: dt.Data, y: dt.Data, index: list[str]):
    return "", [f"{o} % {size}" for o, size in zip(index, x.shape)], None


def _depth_to_space_source(node, state, sdfg, x: dt.Data, y: dt.Data, index: list[str]):
    b, channels = node.blocksize, y.shape[1]
    n, c, h, w = index
    block = f"({h} % {b}) * {b} + {w} % {b}"
    channel = f"{c} * {b * b} + {block}" if node.mode == "CRD" else f"({block}) * {channels} + {c}"
    return "", [n, channel, f"{h} / {b}", f"{w} / {b}"], None


def _space_to_depth_source(node, state, sdfg, x: dt.Data, y: dt.Data, index: list[str]):
    b, channels = node.blocksize, x.shape[1]
    n, c, h, w = index
    block = f"({c} / {channels})"
    return "", [n, f"{c} % {channels}", f"{h} * {b} + {block} / {b}", f"{w} * {b} + {block} % {b}"], None


def _gather_elements_source(node, state, sdfg, x: dt.Data, y: dt.Data, index: list[str]):
    axis = node.axis % len(x.shape)
    indices, size = in_desc_with_name(node, state, sdfg, "indices"), x.shape[axis]
    prelude = f"long long gi = (long long) indices[{offset(indices, index)}];\ngi = gi < 0 ? gi + {size} : gi;\n"
    return prelude, [*index[:axis], "gi", *index[axis + 1:]], None


def _trilu_source(node, state, sdfg, x: dt.Data, y: dt.Data, index: list[str]):
    k = constant_input(node, state, sdfg, "k")[0] if "k" in node.in_connectors else 0
    above = f"{index[-1]} - {index[-2]}"
    return "", index, f"{above} >= {k}" if node.upper else f"{above} <= {k}"


def _trilu_applies(node, state, sdfg) -> bool:
    return "k" not in node.in_connectors or constant_input(node, state, sdfg, "k") is not None


# gap: DaCe has no implementation of these ONNX ops (F.pad, x.repeat and torch.tile, nn.PixelShuffle,
# torch.gather: RoBERTa's token type ids; torch.triu and torch.tril of a computed tensor), nor backward
_register_gather("Pad", _pad_source, _pad_applies, _pad_value)
_register_gather("GatherElements", _gather_elements_source, reads=("indices",))
_register_gather("Tile", _tile_source)
_register_gather("DepthToSpace", _depth_to_space_source)
_register_gather("SpaceToDepth", _space_to_depth_source)
_register_gather("Trilu", _trilu_source, _trilu_applies)


#: where a scatter writes update element ``index``: (C++ declaring what it needs, the output's index); its arguments:
#: node, data, indices, index
Target = Callable[..., tuple[str, list[str]]]


def _normalized(name: str, read: str, size) -> str:
    """C++ declaring ``name``, the index ``read`` names, counted from the start of an axis of ``size``."""
    return f"long long {name} = (long long) {read};\n{name} = {name} < 0 ? {name} + {size} : {name};\n"


def _scatter_nd_target(node, data: dt.Data, indices: dt.Data, index: list[str]):
    depth, batch = int(indices.shape[-1]), len(indices.shape) - 1
    prelude = "".join(
        _normalized(f"t{d}", f"indices[{offset(indices, [*index[:batch], str(d)])}]", data.shape[d])
        for d in range(depth)
    )
    return prelude, [*(f"t{d}" for d in range(depth)), *index[batch:]]


def _scatter_elements_target(node, data: dt.Data, indices: dt.Data, index: list[str]):
    axis = node.axis % len(data.shape)
    prelude = _normalized("t", f"indices[{offset(indices, index)}]", data.shape[axis])
    return prelude, [*index[:axis], "t", *index[axis + 1:]]


def _register_scatter(op: str, target: Target) -> None:
    """Register the ONNX op ``op``: its data copied, then each update written (reduction "add": added) where
    ``target`` says, and its backward: the output's gradient for the data's where no update was written over it, and
    for each update the gradient where it went."""

    def applies(node, state, sdfg) -> bool:
        return getattr(node, "reduction", "none") in ("none", "add")

    def over_updates(node, data, indices, updates, output, body: str) -> str:
        """C++ running ``body`` for each update (``ui``) and where it goes (``oi`` in the output, ``di`` in the
        data)."""
        index = [f"u{d}" for d in range(len(updates.shape))]
        prelude, written = target(node, data, indices, index)
        head, tail = loops(index, updates.shape)
        where = f"const long long ui = {offset(updates, index)};\nconst long long oi = {offset(output, written)};\n"
        return head + prelude + where + f"const long long di = {offset(data, written)};\n" + body + tail

    def copy_all(source: str, source_desc: dt.Data, target_name: str, target_desc: dt.Data) -> str:
        index = [f"c{d}" for d in range(len(target_desc.shape))]
        head, tail = loops(index, target_desc.shape)
        return head + f"{at(target_name, target_desc, index)} = {at(source, source_desc, index)};\n" + tail

    def forward(node, state, sdfg):
        descs = [in_desc_with_name(node, state, sdfg, n) for n in ("data", "indices", "updates")]
        output = out_desc_with_name(node, state, sdfg, "output")
        write = "+=" if getattr(node, "reduction", "none") == "add" else "="
        body = copy_all("data", descs[0], "output", output)
        body += over_updates(node, *descs, output, f"output[oi] {write} updates[ui];\n")
        return cpp_expansion(node, state, sdfg, body)

    def backward(forward_node, context, given_gradients, required_gradients):
        data, indices, updates = (forward_in(forward_node, context, n) for n in ("data", "indices", "updates"))
        output = forward_out(forward_node, context, "output")
        names, body = ["output_grad", "indices"], ""
        if "data" in required_gradients:
            names.append("data_grad")
            body += copy_all("output_grad", output, "data_grad", data)
            if getattr(forward_node, "reduction", "none") == "none":  # what an update overwrote has none
                body += over_updates(forward_node, data, indices, updates, output, "data_grad[di] = 0;\n")
        if "updates" in required_gradients:
            names.append("updates_grad")
            read = "updates_grad[ui] = output_grad[oi];\n"
            body += over_updates(forward_node, data, indices, updates, output, read)
        return cpp_backward(forward_node, context, names, body)

    _register(op, applies, forward, backward)


# gap: DaCe has no implementation of these ONNX ops (``y[:, 1:] = x`` on a new tensor, T5's and BART's shifted
# decoder ids; x.scatter and x.scatter_add), nor backward
_register_scatter("ScatterND", _scatter_nd_target)
_register_scatter("ScatterElements", _scatter_elements_target)

