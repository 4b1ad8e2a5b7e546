"""Convolutions over any number of spatial dimensions: Conv's and ConvTranspose's expansions and backward, as
im2col and a BLAS matrix product (one group) or C++ loops (grouped, depthwise)."""

from __future__ import annotations

import itertools
import math

import dace
import dace.autodiff.utils as autodiff_utils
from dace import data as dt
from dace.autodiff.base_abc import BackwardImplementation
from dace.libraries.blas.nodes.gemm import Gemm
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.properties import ListProperty, Property
from dace.registry import autoregister_params
from dace.sdfg import nodes
from dace.sdfg.utils import in_desc_with_name, out_desc_with_name
from dace.transformation.transformation import ExpandTransformation

from .. import gpu_libs, torch_kernels
from .cpp import (
    at,
    channels_last,
    chunk_total,
    contiguous,
    cpp_backward,
    cpp_expansion,
    cpp_tasklet,
    expansion_sdfg,
    forward_in,
    forward_out,
    kept_nested,
    loops,
    offset,
    parallel_for,
    row_chunks,
    simd,
    zero,
)
from .library_nodes import (
    backward_node,
    concrete,
    connected,
    cudnn_type,
    library_call,
    loops_on_gpu,
    pointer_tasklet,
    shape,
)
from .registry import CHOOSE, choice, default_backward, on_cpu, on_gpu_host, op_versions, pure_expansion


def _window(node, x: dt.Data, w: dt.Data) -> tuple[list[int], list[int], list[int]]:
    """Strides, leading pads and dilations of a convolution over ``x`` (N, C, spatial...) with weights ``w``."""
    rank = len(x.shape) - 2
    strides = list(node.strides) if node.strides else [1] * rank
    dilations = list(node.dilations) if node.dilations else [1] * rank
    if node.auto_pad in ("NOTSET", "VALID"):
        pads = list(node.pads) if node.pads and node.auto_pad == "NOTSET" else [0] * (2 * rank)
        return strides, pads[:rank], dilations
    # SAME_UPPER/SAME_LOWER (padding="same"): as many output elements as input ones per stride, the odd one of
    # the padding at the end (upper) or the beginning (lower)
    kernel = [int(k) for k in w.shape[2:]]
    leading = []
    for size, stride, k, dilation in zip(x.shape[2:], strides, kernel, dilations):
        total = max((-(-int(size) // stride) - 1) * stride + (k - 1) * dilation + 1 - int(size), 0)
        leading.append(total // 2 if node.auto_pad == "SAME_UPPER" else (total + 1) // 2)
    return strides, leading, dilations


def _applies(node, x: dt.Data) -> bool:
    return len(x.shape) >= 3


def _transpose_applies(node, x: dt.Data) -> bool:
    # SAME_* pads and a given output_shape derive the pads from the output's shape (PyTorch gives the pads)
    return len(x.shape) >= 3 and node.auto_pad in ("NOTSET", "VALID") and not node.output_shape


def _spatial(prefix: str, rank: int) -> list[str]:
    return [f"{prefix}{d}" for d in range(rank)]


def _conv_loops(
    node, x: dt.Data, w: dt.Data, y: dt.Data, per_output: str, inner: str, after: str = "", backward: bool = False
) -> str:
    """C++ visiting every output element of a convolution (``per_output`` and ``after`` see ``b, oc, o0..``) and
    every input element it reads (``inner`` also sees ``ic``, the weight's channel ``wc`` and ``k0.., i0..``).

    The threads share the output elements (``per_output`` writes its own); in the ``backward``, which adds into the
    weights' and the input's gradients, the groups (each with channels of its own)."""
    rank = len(x.shape) - 2
    strides, pads, dilations = _window(node, x, w)
    groups = node.group or 1
    per_group_in, per_group_out = x.shape[1] // groups, w.shape[0] // groups
    out, kernel, image = _spatial("o", rank), _spatial("k", rank), _spatial("i", rank)
    if not backward:
        head, tail = loops(["b", "oc", *out], y.shape)
        head = parallel_for(collapse=2) + head
    else:
        head, tail = loops(["g", "b", "ocg", *out], [groups, y.shape[0], per_group_out, *y.shape[2:]])
        head = parallel_for() + head + f"const long long oc = g * {per_group_out} + ocg;\n"
    inner_head, inner_tail = loops(["wc", *kernel], w.shape[1:])
    positions = "".join(
        f"const long long {i} = {o} * {s} - {p} + {k} * {d};\n"
        for i, o, k, s, p, d in zip(image, out, kernel, strides, pads, dilations)
    )
    outside = " || ".join(f"{i} < 0 || {i} >= {size}" for i, size in zip(image, x.shape[2:]))
    return (
        head
        + per_output
        + inner_head
        + f"const long long ic = (oc / {per_group_out}) * {per_group_in} + wc;\n"
        + positions
        + f"if ({outside}) continue;\n"
        + inner
        + inner_tail
        + after
        + tail
    )


def _depthwise_rows(conv, x: dt.Data, w: dt.Data, y: dt.Data) -> bool:
    """Whether a convolution is depthwise (a channel of weights per channel) over images both laid out
    channels-last, where its loops go over pixels with the channels innermost (``_depthwise_rows_code``)."""
    channels = int(x.shape[1])
    depthwise = (conv.group or 1) == channels == int(w.shape[0]) and int(w.shape[1]) == 1
    return depthwise and channels_last(x) and channels_last(y)


def _depthwise_rows_code(conv, x: dt.Data, w: dt.Data, y: dt.Data, wanted: list[str], bias: dt.Data | None) -> str:
    """C++ of a depthwise convolution over channels-last images (``_depthwise_rows``): forward (``wanted`` empty)
    or the gradients ``wanted``. Each pixel's channels are one run of memory, so every loop over them is a vector
    loop: the planes' loops read each element C apart. The weights are copied tap by tap, channels innermost."""
    rank = len(x.shape) - 2
    strides, pads, dilations = _window(conv, x, w)
    channels, ctype = int(x.shape[1]), x.dtype.ctype
    kernel = [int(k) for k in w.shape[2:]]
    taps = math.prod(kernel)
    out, image, ks = _spatial("o", rank), _spatial("i", rank), _spatial("k", rank)
    tap = " + ".join(f"{k} * {math.prod(kernel[d + 1:])}" for d, k in enumerate(ks))
    over_taps, taps_end = loops(ks, kernel)
    each = lambda code: simd() + f"for (long long c = 0; c < {channels}; ++c) {{ {code} }}\n"
    row = lambda name, desc, spatial: f"&{at(name, desc, ['b', '0', *spatial])}"
    # an output pixel's tap reads the input pixel i = o * stride - pad + k * dilation, where there is one
    read = "".join(
        f"const long long {i} = {o} * {s} - {p} + {k} * {d};\n"
        for i, o, k, s, p, d in zip(image, out, ks, strides, pads, dilations)
    )
    read += "if (" + " || ".join(f"{i} < 0 || {i} >= {n}" for i, n in zip(image, x.shape[2:])) + ") continue;\n"
    table = ""
    if "X" in wanted or not wanted:  # the forward and the input's gradient read the weights
        head, tail = loops(["c", *ks], [channels, *kernel])
        table = f"{ctype}* _taps = new {ctype}[{taps * channels}];\n"
        table += head + f"_taps[({tap}) * {channels} + c] = {at('W', w, ['c', '0', *ks])};\n" + tail
    if not wanted:
        head, tail = loops(["b", *out], [y.shape[0], *y.shape[2:]])
        body = parallel_for(collapse=2) + head + f"{ctype}* _y = {row('Y', y, out)};\n"
        body += each(f"_y[c] = {'B[c * ' + str(bias.strides[0]) + ']' if bias is not None else '0'};")
        body += over_taps + read
        body += f"const {ctype}* _x = {row('X', x, image)};\nconst {ctype}* _w = &_taps[({tap}) * {channels}];\n"
        return table + body + each("_y[c] += _w[c] * _x[c];") + taps_end + tail + "delete[] _taps;\n"
    body = ""
    if "X" in wanted:
        # each input pixel gathers the output pixels it was read by: no two threads add into one element
        found = "".join(
            f"const long long _t{d} = {i} + {p} - {k} * {dil};\n"
            f"if (_t{d} < 0 || _t{d} % {s} != 0 || _t{d} / {s} >= {n}) continue;\n"
            f"const long long {o} = _t{d} / {s};\n"
            for d, (i, o, k, s, p, dil, n) in enumerate(zip(image, out, ks, strides, pads, dilations, y.shape[2:]))
        )
        head, tail = loops(["b", *image], [x.shape[0], *x.shape[2:]])
        body += table + parallel_for(collapse=2) + head + f"{ctype}* _dx = {row('X_grad', x, image)};\n"
        body += each("_dx[c] = 0;") + over_taps + found
        body += f"const {ctype}* _dy = {row('Y_grad', y, out)};\nconst {ctype}* _w = &_taps[({tap}) * {channels}];\n"
        body += each("_dx[c] += _w[c] * _dy[c];") + taps_end + tail + "delete[] _taps;\n"
    if "W" in wanted or "B" in wanted:
        # over rows (b, o0) of output pixels, partial sums per chunk of rows: each tap's, then the bias's
        size = (taps + 1) * channels
        row_head, row_tail, chunks = row_chunks(int(y.shape[0]) * int(y.shape[2]), size)
        body += row_head + f"const long long b = _r / {y.shape[2]}, {out[0]} = _r % {y.shape[2]};\n"
        head, tail = loops(out[1:], y.shape[3:])
        body += head + f"const {ctype}* _dy = {row('Y_grad', y, out)};\n"
        if "B" in wanted:
            body += each(f"_s[{taps * channels} + c] += _dy[c];")
        if "W" in wanted:
            body += over_taps + read
            body += f"const {ctype}* _x = {row('X', x, image)};\ndouble* _sw = _s + ({tap}) * {channels};\n"
            body += each("_sw[c] += (double)_dy[c] * _x[c];") + taps_end
        body += tail + row_tail
        if "W" in wanted:
            head, tail = loops(["c", *ks], [channels, *kernel])
            total = chunk_total("_t", chunks, size, f"({tap}) * {channels} + c")
            body += head + total + f"{at('W_grad', w, ['c', '0', *ks])} = _t;\n" + tail
        if "B" in wanted:
            total = chunk_total("_t", chunks, size, f"{taps * channels} + c")
            body += f"for (long long c = 0; c < {channels}; ++c) {{\n{total}B_grad[c * {bias.strides[0]}] = _t;\n}}\n"
        body += "delete[] _part;\n"
    return body


def _conv_transpose_loops(node, x: dt.Data, w: dt.Data, y: dt.Data, per_input: str, inner: str, after: str = ""):
    """C++ visiting every input element of a transposed convolution (``per_input`` and ``after`` see
    ``b, ic, i0..``) and every output element it adds to (``inner`` also sees ``oc``, the weight's channel ``wc``
    and ``k0.., o0..``): output ``o = i * stride - pad + k * dilation``, the convolution's map turned around."""
    rank = len(x.shape) - 2
    strides, pads, dilations = _window(node, x, w)
    groups = node.group or 1
    per_group_in, per_group_out = x.shape[1] // groups, w.shape[1]
    image, kernel, out = _spatial("i", rank), _spatial("k", rank), _spatial("o", rank)
    head, tail = loops(["b", "ic", *image], x.shape)
    inner_head, inner_tail = loops(["wc", *kernel], w.shape[1:])
    positions = "".join(
        f"const long long {o} = {i} * {s} - {p} + {k} * {d};\n"
        for o, i, k, s, p, d in zip(out, image, kernel, strides, pads, dilations)
    )
    outside = " || ".join(f"{o} < 0 || {o} >= {size}" for o, size in zip(out, y.shape[2:]))
    return (
        head
        + per_input
        + inner_head
        + f"const long long oc = (ic / {per_group_in}) * {per_group_out} + wc;\n"
        + positions
        + f"if ({outside}) continue;\n"
        + inner
        + inner_tail
        + after
        + tail
    )


def _element(name: str, desc: dt.Data, channels: list[str], spatial: str) -> str:
    return at(name, desc, [*channels, *_spatial(spatial, len(desc.shape) - 2)])


def _bias_gradient(y: dt.Data) -> str:
    """C++ adding the output gradient up per channel into ``B_grad`` (zeroed before)."""
    index = ["b", "oc", *_spatial("o", len(y.shape) - 2)]
    head, tail = loops(index, y.shape)
    return head + f"B_grad[oc] += {at('Y_grad', y, index)};\n" + tail


# A convolution of one group as matrix products (im2col), which dcnb's BLAS fix (fixes.linalg) runs through a
# BLAS: the input's windows laid out as the columns of ``cols`` (input channel and kernel offset by batch and
# output position), the weights as the matrix ``wmat`` (output channel by input channel and kernel offset), and
# Y = wmat @ cols. Its backward: dW = dY @ cols^T, and dcols = wmat^T @ dY added back into the windows (col2im).
# A transposed convolution is the same product turned around: cols = wmat^T @ X, added into Y's windows.
_GEMM_DTYPES = (dace.float32, dace.float64)


def _uses_gemm(node, x: dt.Data) -> bool:
    # grouped convolutions (depthwise ones: a product per channel of a few elements) stay loops
    return (node.group or 1) == 1 and x.dtype in _GEMM_DTYPES


def _add_matrix(sdfg: dace.SDFG, name: str, layout: str, w: dt.Data, dense: dt.Data) -> None:
    """Add the transient matrix ``name`` laid out as ``cols``, ``wmat`` or ``dense`` (channel by batch and position
    of ``dense``: the convolution's output, the transposed convolution's input)."""
    channels, window = int(w.shape[0]), math.prod(int(n) for n in w.shape[1:])
    positions = int(dense.shape[0]) * math.prod(int(n) for n in dense.shape[2:])
    shape = {"cols": (window, positions), "wmat": (channels, window), "dense": (channels, positions)}[layout]
    sdfg.add_array(name, shape, dense.dtype, transient=True)


def _columns(
    node, w: dt.Data, dense: dt.Data, windowed: dt.Data, inside: str, outside: str = "", adds: bool = False
) -> str:
    """C++ over the elements of ``cols`` (``ci``, its offset; the weight's channel and kernel offset by the batch
    and position of ``dense``), on all threads: ``inside`` where one is an element of ``windowed`` (``wi``, its offset),
    ``outside`` where it falls into the padding. ``windowed`` is a convolution's input, a transposed one's output."""
    rank = len(dense.shape) - 2
    # a convolution's input sizes its SAME pads; a transposed convolution has explicit pads only
    strides, pads, dilations = _window(node, windowed, w)
    kernel, at_dense, at_windowed = _spatial("k", rank), _spatial("p", rank), _spatial("q", rank)
    variables, sizes = ["c", *kernel, "b", *at_dense], [*w.shape[1:], dense.shape[0], *dense.shape[2:]]
    head, tail = loops(variables, sizes)
    positions = "".join(
        f"const long long {q} = {p} * {s} - {pad} + {k} * {d};\n"
        for q, p, k, s, pad, d in zip(at_windowed, at_dense, kernel, strides, pads, dilations)
    )
    within = " && ".join(f"{q} >= 0 && {q} < {size}" for q, size in zip(at_windowed, windowed.shape[2:]))
    # the threads share the rows of cols, each a channel and a kernel offset; where ``inside`` adds into
    # ``windowed`` (col2im), whose windows overlap across kernel offsets, only the channels (each its own elements)
    rows = 1 if adds else 1 + rank
    return (
        parallel_for(collapse=rows)
        + head
        + f"const long long ci = {_contiguous_offset(sizes, variables)};\n"
        + positions
        + f"if ({within}) {{\nconst long long wi = {offset(windowed, ['b', 'c', *at_windowed])};\n{inside}}}"
        + (f" else {{\n{outside}}}\n" if outside else "\n")
        + tail
    )


def _contiguous_offset(shape, index: list[str]) -> str:
    return offset(dt.Array(dace.float32, shape), index)


def _weights_matrix(name: str, w: dt.Data, matrix: str, to_matrix: bool) -> str:
    """C++ copying the weights (or their gradient) ``name`` into ``matrix``, laid out as ``wmat``, or back."""
    index = [f"w{d}" for d in range(len(w.shape))]
    head, tail = loops(index, w.shape)
    pair = (f"{matrix}[{_contiguous_offset(w.shape, index)}]", at(name, w, index))
    return head + f"{pair[0 if to_matrix else 1]} = {pair[1 if to_matrix else 0]};\n" + tail


def _dense_matrix(name: str, desc: dt.Data, matrix: str, to_matrix: bool, bias: str = "") -> str:
    """C++ copying ``name`` (batch, channel, positions) into ``matrix``, laid out as ``dense`` (channel by batch
    and position), or back, adding ``bias`` (seen by ``oc``)."""
    out = _spatial("o", len(desc.shape) - 2)
    head, tail = loops(["b", "oc", *out], desc.shape)
    head = parallel_for(collapse=2) + head
    per_sample = math.prod(int(n) for n in desc.shape[2:])
    flat = f"oc * {per_sample * int(desc.shape[0])} + b * {per_sample} + {_contiguous_offset(desc.shape[2:], out)}"
    element = at(name, desc, ["b", "oc", *out])
    copy = f"{matrix}[{flat}] = {element};\n" if to_matrix else f"{element} = {matrix}[{flat}]{bias};\n"
    return head + copy + tail


def _gemm_state(sdfg: dace.SDFG, a: str, b: str, c: str, trans_a: bool = False, trans_b: bool = False):
    """A state computing ``c = a @ b`` (either transposed) with DaCe's Gemm node, which dcnb expands to a BLAS."""
    state = sdfg.add_state()
    gemm = Gemm(f"{c}_gemm", transA=trans_a, transB=trans_b, alpha=1, beta=0)
    state.add_node(gemm)
    for name, connector in ((a, "_a"), (b, "_b")):
        state.add_edge(state.add_read(name), None, gemm, connector, dace.Memlet.from_array(name, sdfg.arrays[name]))
    state.add_edge(gemm, "_c", state.add_write(c), None, dace.Memlet.from_array(c, sdfg.arrays[c]))
    return state


def _chain(sdfg: dace.SDFG, states: list) -> None:
    for before, after in itertools.pairwise(states):
        sdfg.add_edge(before, after, dace.InterstateEdge())


def _conv_gemm_expansion(nsdfg: dace.SDFG, conv, x: dt.Data, w: dt.Data, y: dt.Data, bias: bool) -> dace.SDFG:
    for name in ("cols", "wmat", "dense"):
        _add_matrix(nsdfg, name, name, w, y)
    layout = _columns(conv, w, y, x, "cols[ci] = X[wi];\n", "cols[ci] = 0;\n")
    layout += _weights_matrix("W", w, "wmat", True)
    output = _dense_matrix("Y", y, "dense", False, " + B[oc]" if bias else "")
    _chain(
        nsdfg,
        [
            cpp_tasklet(nsdfg, "im2col", ["X", "W"], ["cols", "wmat"], layout),
            _gemm_state(nsdfg, "wmat", "cols", "dense"),
            cpp_tasklet(nsdfg, "output", ["dense", *(["B"] if bias else [])], ["Y"], output),
        ],
    )
    return nsdfg


def _conv_gemm_backward(sdfg: dace.SDFG, conv, x: dt.Data, w: dt.Data, y: dt.Data, wanted: list[str]) -> None:
    """The states of a convolution's gradients ``wanted`` as matrix products, added to ``sdfg`` (holding the
    arrays they read and write)."""
    states = []
    if "X" in wanted or "W" in wanted:
        _add_matrix(sdfg, "dy", "dense", w, y)
        states.append(cpp_tasklet(sdfg, "dy", ["Y_grad"], ["dy"], _dense_matrix("Y_grad", y, "dy", True)))
    if "W" in wanted:
        _add_matrix(sdfg, "cols", "cols", w, y)
        _add_matrix(sdfg, "dw", "wmat", w, y)
        im2col = _columns(conv, w, y, x, "cols[ci] = X[wi];\n", "cols[ci] = 0;\n")
        states.append(cpp_tasklet(sdfg, "im2col", ["X"], ["cols"], im2col))
        states.append(_gemm_state(sdfg, "dy", "cols", "dw", trans_b=True))
        states.append(cpp_tasklet(sdfg, "dw", ["dw"], ["W_grad"], _weights_matrix("W_grad", w, "dw", False)))
    if "X" in wanted:
        _add_matrix(sdfg, "wmat", "wmat", w, y)
        _add_matrix(sdfg, "dcols", "cols", w, y)
        states.append(cpp_tasklet(sdfg, "weights", ["W"], ["wmat"], _weights_matrix("W", w, "wmat", True)))
        states.append(_gemm_state(sdfg, "wmat", "dy", "dcols", trans_a=True))
        col2im = zero("X_grad", x) + _columns(conv, w, y, x, "X_grad[wi] += dcols[ci];\n", adds=True)
        states.append(cpp_tasklet(sdfg, "col2im", ["dcols"], ["X_grad"], col2im))
    if "B" in wanted:
        body = zero("B_grad", sdfg.arrays["B_grad"]) + _bias_gradient(y)
        states.append(cpp_tasklet(sdfg, "db", ["Y_grad"], ["B_grad"], body))
    _chain(sdfg, states)


def _bias_gradient_state(sdfg: dace.SDFG, forward_node, context, y: dt.Data):
    body = zero("B_grad", forward_in(forward_node, context, "B")) + _bias_gradient(y)
    return cpp_tasklet(sdfg, "db", ["Y_grad"], ["B_grad"], body)


def _conv_transpose_gemm_expansion(node, state, sdfg) -> dace.SDFG:
    x, w = in_desc_with_name(node, state, sdfg, "X"), in_desc_with_name(node, state, sdfg, "W")
    y = out_desc_with_name(node, state, sdfg, "Y")
    nsdfg, inputs, _ = expansion_sdfg(node, state, sdfg)
    for name in ("cols", "wmat", "dense"):
        _add_matrix(nsdfg, name, name, w, x)
    layout = _dense_matrix("X", x, "dense", True) + _weights_matrix("W", w, "wmat", True)
    index = ["b", "oc", *_spatial("o", len(y.shape) - 2)]
    head, tail = loops(index, y.shape)
    # every output element starts at its bias: output_padding's trailing ones receive nothing else
    col2im = head + f"{at('Y', y, index)} = {'B[oc]' if 'B' in inputs else '0'};\n" + tail
    col2im += _columns(node, w, x, y, "Y[wi] += cols[ci];\n", adds=True)
    _chain(
        nsdfg,
        [
            cpp_tasklet(nsdfg, "layout", ["X", "W"], ["dense", "wmat"], layout),
            _gemm_state(nsdfg, "wmat", "dense", "cols", trans_a=True),
            cpp_tasklet(nsdfg, "col2im", ["cols", *(["B"] if "B" in inputs else [])], ["Y"], col2im),
        ],
    )
    return nsdfg


def _conv_transpose_gemm_backward(forward_node, context, wanted: list[str]):
    x, w = forward_in(forward_node, context, "X"), forward_in(forward_node, context, "W")
    y = forward_out(forward_node, context, "Y")
    reads = [n for n in ("X", "W") if {"X": "W", "W": "X"}[n] in wanted]
    node, result = autodiff_utils.add_empty_sdfg_for_node(
        forward_node, ["Y_grad", *reads, *(f"{n}_grad" for n in wanted)], context
    )
    sdfg, states = node.sdfg, []
    if "X" in wanted or "W" in wanted:
        _add_matrix(sdfg, "dcols", "cols", w, x)
        im2col = _columns(forward_node, w, x, y, "dcols[ci] = Y_grad[wi];\n", "dcols[ci] = 0;\n")
        states.append(cpp_tasklet(sdfg, "im2col", ["Y_grad"], ["dcols"], im2col))
    if "W" in wanted:
        _add_matrix(sdfg, "dense", "dense", w, x)
        _add_matrix(sdfg, "dw", "wmat", w, x)
        states.append(cpp_tasklet(sdfg, "input", ["X"], ["dense"], _dense_matrix("X", x, "dense", True)))
        states.append(_gemm_state(sdfg, "dense", "dcols", "dw", trans_b=True))
        states.append(cpp_tasklet(sdfg, "dw", ["dw"], ["W_grad"], _weights_matrix("W_grad", w, "dw", False)))
    if "X" in wanted:
        _add_matrix(sdfg, "wmat", "wmat", w, x)
        _add_matrix(sdfg, "dx", "dense", w, x)
        states.append(cpp_tasklet(sdfg, "weights", ["W"], ["wmat"], _weights_matrix("W", w, "wmat", True)))
        states.append(_gemm_state(sdfg, "wmat", "dcols", "dx"))
        states.append(cpp_tasklet(sdfg, "dx", ["dx"], ["X_grad"], _dense_matrix("X_grad", x, "dx", False)))
    if "B" in wanted:
        states.append(_bias_gradient_state(sdfg, forward_node, context, y))
    _chain(sdfg, states)
    return node, result


def _windowed(node, x: dt.Data, w: dt.Data) -> dict:
    """The attributes of a Convolution node for the ONNX Conv ``node``: its window with the leading pads on both
    sides (what the C++ loops and cuDNN read; the trailing ones only size the output, which is given)."""
    strides, pads, dilations = _window(node, x, w)
    return {"strides": strides, "pads": pads + pads, "dilations": dilations, "group": node.group or 1}


@pure_expansion("Conv", name="dcnb")
class ConvExpansion(ONNXForward):
    # gap: DaCe's pure Conv covers 2-D images without dilation only, and takes the output's height bound from its
    # width and the strides the other way round (a non-square output or unequal strides computed wrong values)
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return _applies(node, in_desc_with_name(node, state, sdfg, "X"))

    @staticmethod
    def forward(node, state, sdfg):
        x, w = in_desc_with_name(node, state, sdfg, "X"), in_desc_with_name(node, state, sdfg, "W")
        names = [n for n in ("X", "W", "B") if n in node.in_connectors]
        return Convolution(node.label, inputs=set(names), outputs={"Y"}, **_windowed(node, x, w))


# what an SDFG holding an ONNX Conv may call once expanded: the build's key then names the bridge's library
torch_kernels.EXPANDING_TO_CALLERS.extend(op_versions("Conv"))


def _conv_loops_sdfg(conv, state, sdfg) -> dace.SDFG:
    """A Convolution node's C++ loops (im2col and BLAS products where there is one group), forward or backward."""
    nsdfg, inputs, outputs = expansion_sdfg(conv, state, sdfg)
    arrays = nsdfg.arrays
    x, w = arrays.get("X", arrays.get("X_grad")), arrays.get("W", arrays.get("W_grad"))
    if "Y" in outputs:
        y = arrays["Y"]
        if _uses_gemm(conv, x):
            return _conv_gemm_expansion(nsdfg, conv, x, w, y, "B" in inputs)
        if _depthwise_rows(conv, x, w, y) and on_cpu(conv, state, sdfg):
            body = _depthwise_rows_code(conv, x, w, y, [], arrays.get("B") if "B" in inputs else None)
            cpp_tasklet(nsdfg, f"{conv.label}_tasklet", inputs, outputs, body)
            return nsdfg
        body = _conv_loops(
            conv,
            x,
            w,
            y,
            f"double acc = {'B[oc]' if 'B' in inputs else '0'};\n",
            f"acc += (double){_element('W', w, ['oc', 'wc'], 'k')} * {_element('X', x, ['b', 'ic'], 'i')};\n",
            f"{_element('Y', y, ['b', 'oc'], 'o')} = acc;\n",
        )
        cpp_tasklet(nsdfg, f"{conv.label}_tasklet", inputs, outputs, body)
        return nsdfg
    y = arrays["Y_grad"]
    wanted = [n.removesuffix("_grad") for n in outputs]
    if _uses_gemm(conv, x):
        _conv_gemm_backward(nsdfg, conv, x, w, y, wanted)
        return nsdfg
    if _depthwise_rows(conv, x, w, y) and on_cpu(conv, state, sdfg):
        body = _depthwise_rows_code(conv, x, w, y, wanted, arrays.get("B_grad"))
        cpp_tasklet(nsdfg, f"{conv.label}_backward", inputs, outputs, body)
        return nsdfg
    body = "".join(zero(f"{n}_grad", arrays[f"{n}_grad"]) for n in wanted)
    per_output = f"const auto dy = {_element('Y_grad', y, ['b', 'oc'], 'o')};\n"
    inner = ""
    if "W" in wanted:
        inner += f"{_element('W_grad', w, ['oc', 'wc'], 'k')} += dy * {_element('X', x, ['b', 'ic'], 'i')};\n"
    if "X" in wanted:
        inner += f"{_element('X_grad', x, ['b', 'ic'], 'i')} += dy * {_element('W', w, ['oc', 'wc'], 'k')};\n"
    if inner:
        body += _conv_loops(conv, x, w, y, per_output, inner, backward=True)
    if "B" in wanted:
        body += _bias_gradient(y)
    cpp_tasklet(nsdfg, f"{conv.label}_backward", inputs, outputs, body)
    return nsdfg


def _conv_loops_expansion(conv, state, sdfg) -> dace.SDFG:
    return loops_on_gpu(conv, state, sdfg, _conv_loops_sdfg(conv, state, sdfg))


def _trailing_pads(conv, x: dt.Data, w: dt.Data, y: dt.Data) -> list[int]:
    """The pads after each spatial dimension that give the output its size: the leading ones where those do
    (symmetric padding, as PyTorch's ``padding``), else the fewest that do (TensorFlow's SAME at stride 2 pads one
    more at the end), negative where even none leaves more windows than the output has."""
    trailing = []
    for size, out, k, s, p, d in zip(x.shape[2:], y.shape[2:], w.shape[2:], conv.strides, conv.pads, conv.dilations):
        reach = d * (int(k) - 1) + 1
        even = (int(size) + 2 * p - reach) // s + 1 == int(out)
        trailing.append(p if even else (int(out) - 1) * s + reach - int(size) - p)
    return trailing


def _library_operands(conv, state, sdfg, even: bool = True) -> tuple[dict, list, list, list] | None:
    """(the connected arrays, and X's, W's and Y's descriptors, each with its gradient's where connected) where a
    library (cuDNN, PyTorch's) can take ``conv``: one type, float32 or float64, numbers for shapes and strides, the
    three operands there, no array of one element (which DaCe passes by value), a packed bias, and pads that give
    the output its size: as many at both ends (``even``), or else any not negative (``_trailing_pads``); else
    None."""
    arrays = connected(conv, state, sdfg)
    descs = list(arrays.values())
    if len({d.dtype for d in descs}) != 1 or descs[0].dtype not in _GEMM_DTYPES or not all(map(concrete, descs)):
        return None
    if any(math.prod(int(n) for n in d.shape) == 1 for d in descs):
        return None
    if any(not contiguous(arrays[n]) for n in ("B", "B_grad") if n in arrays):
        return None
    x, w, y = ([arrays[n] for n in (a, f"{a}_grad") if n in arrays] for a in ("X", "W", "Y"))
    if not (x and w and y):
        return None
    rank = len(x[0].shape) - 2
    trailing = _trailing_pads(conv, x[0], w[0], y[0])
    if any(t < 0 for t in trailing) or (even and trailing != list(conv.pads[:rank])):
        return None
    return arrays, x, w, y


def _cudnn_applies(conv, state, sdfg) -> bool:
    """Whether cuDNN computes what the loops do: GPU memory outside kernels, what any library takes
    (``_library_operands``), 1 to 3 spatial dimensions, packed weights, one layout for an array and its gradient."""
    operands = _library_operands(conv, state, sdfg) if on_gpu_host(conv, state, sdfg) else None
    if operands is None:
        return False
    arrays, x, w, y = operands
    if not 3 <= len(x[0].shape) <= 5 or not all(map(contiguous, w)):
        return False
    # one descriptor each for an array and its gradient
    if any(len({tuple(int(s) for s in d.strides) for d in same}) != 1 for same in (x, w, y)):
        return False
    # the bias's gradient is summed by cuBLAS over the output gradient as laid out packed (gpu_libs.h)
    return "B_grad" not in arrays or contiguous(arrays["Y_grad"])


def _cudnn_call(conv, state, sdfg) -> nodes.Tasklet:
    """cuDNN's convolution forward (with the bias added) or gradients, descriptors and algorithms chosen once when
    the binary is loaded."""
    arrays = connected(conv, state, sdfg)
    x, w = arrays.get("X", arrays.get("X_grad")), arrays.get("W", arrays.get("W_grad"))
    forward = "Y" in arrays
    y = arrays["Y" if forward else "Y_grad"]
    rank = len(x.shape) - 2
    runs = "f" if forward else "".join(r for n, r in (("X_grad", "d"), ("W_grad", "w"), ("B_grad", "b")) if n in arrays)
    create = (
        f"FIELD.create(__state->dcnb_cudnn, {cudnn_type(x)}, {shape(x)}, {shape(w)}, {shape(y)}, "
        f"dcnb_gpu::Spatial({gpu_libs.dims(conv.pads[:rank])}, 0), "
        f"dcnb_gpu::Spatial({gpu_libs.dims(conv.strides)}, 1), "
        f"dcnb_gpu::Spatial({gpu_libs.dims(conv.dilations)}, 1), {conv.group}, \"{runs}\")"
    )
    ctype = x.dtype.ctype
    given = lambda name: name if name in arrays else f"({ctype} *)nullptr"
    if forward:
        call = f"FIELD.forward<{ctype}>(__state->dcnb_cudnn, __dace_current_stream, X, W, {given('B')}, Y)"
    else:
        grads = ", ".join(given(n) for n in ("X_grad", "W_grad", "B_grad"))
        call = (
            f"FIELD.backward<{ctype}>(__state->dcnb_cudnn, __state->dcnb_cublas, __dace_current_stream, Y_grad, "
            f"{given('X')}, {given('W')}, {grads})"
        )
    return library_call(conv, state, sdfg, "conv", "dcnb_gpu::Convolution", create, call)


def _torch_applies(conv, state, sdfg) -> bool:
    """Whether PyTorch's convolution computes what the loops do, on the CPU: what any library takes
    (``_library_operands``; uneven pads too, which the bridge adds to the input itself), an array and its gradient
    alike, depthwise only where ``for_depthwise``, 1x1 only where ``for_pointwise``, and the bridge built here."""
    operands = _library_operands(conv, state, sdfg, even=False) if on_cpu(conv, state, sdfg) else None
    if operands is None:
        return False
    _, x, w, y = operands
    if any(len({(tuple(map(int, d.shape)), tuple(map(int, d.strides))) for d in same}) != 1 for same in (x, w, y)):
        return False
    if conv.group > 1 and int(x[0].shape[1]) == conv.group:
        # depthwise: dcnb's loops on all threads took 0.55-1.2x eager's time, PyTorch's 1.36x, but for some windows
        # where ATen has AVX-512 kernels (torch_kernels.for_depthwise)
        window, image = tuple(int(k) for k in w[0].shape[2:]), tuple(int(n) for n in x[0].shape[2:])
        undilated = all(int(d) == 1 for d in conv.dilations)
        if not (undilated and torch_kernels.for_depthwise(window, tuple(int(s) for s in conv.strides), image)):
            return False
    if conv.group == 1 and all(int(k) == 1 for k in w[0].shape[2:]) and not torch_kernels.for_pointwise():
        # a 1x1 convolution is a matrix product, which dcnb's BLAS call computes; where ATen has no AVX-512
        # kernels that was the faster (torch_kernels.for_pointwise)
        return False
    return torch_kernels.library() is not None


def _torch_call(conv, state, sdfg) -> nodes.Tasklet:
    """A tasklet calling PyTorch's convolution, forward (with the bias added) or the gradients asked for."""
    arrays = connected(conv, state, sdfg)
    x, w = arrays.get("X", arrays.get("X_grad")), arrays.get("W", arrays.get("W_grad"))
    y = arrays.get("Y", arrays.get("Y_grad"))
    rank = len(x.shape) - 2
    numbers = lambda values: f"(const int64_t[]){{{', '.join(str(int(v)) for v in values)}}}"
    given = lambda name: name if name in arrays else "nullptr"
    common = f"{int(x.dtype == dace.float64)}, {rank}"
    x_of, w_of, y_of = (f"{numbers(d.shape)}, {numbers(d.strides)}" for d in (x, w, y))
    pads = [*conv.pads[:rank], *_trailing_pads(conv, x, w, y)]
    window = f"{numbers(conv.strides)}, {numbers(pads)}, {numbers(conv.dilations)}, {conv.group}"
    if "Y" in arrays:
        call = f"dcnb_torch_conv({common}, {x_of}, X, {w_of}, W, {given('B')}, {y_of}, Y, {window});"
    else:
        grads = ", ".join(given(f"{n}_grad") for n in ("X", "W", "B"))
        call = (
            f"dcnb_torch_conv_backward({common}, {x_of}, {given('X')}, {w_of}, {given('W')}, {y_of}, Y_grad, "
            f"{grads}, {window});"
        )
    return pointer_tasklet(conv, state, sdfg, call)


@dace.library.expansion
class ExpandConvolutionTorch(ExpandTransformation):
    # gap: DaCe has no CPU convolution but loops (and im2col with a BLAS, dcnb's): PyTorch's own kernels (oneDNN's)
    environments = [torch_kernels.TorchKernels]
    expansion = staticmethod(_torch_call)


@dace.library.expansion
class ExpandConvolutionLoops(ExpandTransformation):
    # gap: DaCe's pure Conv covers 2-D images without dilation only, and computed non-square outputs wrong (see
    # ConvExpansion): C++ loops over any number of dimensions, im2col and BLAS products for one group
    environments = []
    expansion = staticmethod(_conv_loops_expansion)
    postprocessing = staticmethod(lambda sdfg, state, nested: kept_nested(nested))


@dace.library.expansion
class ExpandConvolutionCudnn(ExpandTransformation):
    # gap: DaCe's only GPU convolution is ATen's depthwise kernel (backward only, needing PyTorch's CUDA headers);
    # in CUDA builds the loops ran as one-thread kernels: cuDNN, as eager calls it (and cuBLAS for a bias's gradient)
    environments = [gpu_libs.CuDNN, gpu_libs.CuBLAS]
    expansion = staticmethod(_cudnn_call)


@dace.library.expansion
class ExpandConvolutionChoice(ExpandTransformation):
    # gap: which code a convolution gets depends on where the build placed it, known only at code generation
    environments = []
    expansion = choice(
        lambda conv, state, sdfg: "cudnn"
        if _cudnn_applies(conv, state, sdfg)
        else "torch"
        if _torch_applies(conv, state, sdfg)
        else "loops"
    )


@dace.library.node
class Convolution(nodes.LibraryNode):
    """A convolution of one group or more (cross-correlation, as PyTorch's): forward (X, W, B -> Y) or its
    gradients (Y_grad, X, W -> X_grad, W_grad, B_grad, those asked for); ``pads`` holds the leading pad of each
    spatial dimension twice (the trailing ones only size the output, which is given)."""

    implementations = {
        "loops": ExpandConvolutionLoops,
        "cudnn": ExpandConvolutionCudnn,
        "torch": ExpandConvolutionTorch,
        CHOOSE: ExpandConvolutionChoice,
    }
    default_implementation = CHOOSE

    strides = ListProperty(element_type=int, default=[])
    pads = ListProperty(element_type=int, default=[])
    dilations = ListProperty(element_type=int, default=[])
    group = Property(dtype=int, default=1)
    auto_pad = Property(dtype=str, default="NOTSET", desc="read by the window's helpers: pads are explicit")

    def __init__(self, name, inputs=None, outputs=None, strides=(), pads=(), dilations=(), group=1):
        super().__init__(name, inputs=inputs or set(), outputs=outputs or set())
        self.strides, self.pads, self.dilations, self.group = list(strides), list(pads), list(dilations), group


@autoregister_params(op="Conv", name="dcnb")
class ConvBackward(BackwardImplementation):
    # gap: DaCe's only Conv backward calls ATen's CUDA depthwise kernel (at::thnn_conv_depthwise2d_backward_out),
    # which does not compile on CPU: every network with a convolution failed to build its backward
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return _applies(node, in_desc_with_name(node, state, sdfg, "X"))

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        x, w = forward_in(forward_node, context, "X"), forward_in(forward_node, context, "W")
        wanted = [n for n in ("X", "W", "B") if n in required_gradients]
        reads = [n for n in ("X", "W") if {"X": "W", "W": "X"}[n] in wanted]
        grads = [f"{n}_grad" for n in wanted]
        node, result = autodiff_utils.add_empty_sdfg_for_node(forward_node, ["Y_grad", *reads, *grads], context)
        conv = Convolution(f"{forward_node.label}_backward", **_windowed(forward_node, x, w))
        backward_node(node, conv, ["Y_grad", *reads], grads)
        return node, result


default_backward("Conv")


@pure_expansion("ConvTranspose")
class ConvTransposeExpansion(ONNXForward):
    # gap: DaCe has no implementation of the ONNX op ConvTranspose (nn.ConvTranspose1d/2d/3d, decoders, U-Nets)
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return _transpose_applies(node, in_desc_with_name(node, state, sdfg, "X"))

    @staticmethod
    def forward(node, state, sdfg):
        x, w = in_desc_with_name(node, state, sdfg, "X"), in_desc_with_name(node, state, sdfg, "W")
        if _uses_gemm(node, x):
            return _conv_transpose_gemm_expansion(node, state, sdfg)
        y = out_desc_with_name(node, state, sdfg, "Y")
        index = ["b", "oc", *_spatial("o", len(y.shape) - 2)]
        head, tail = loops(index, y.shape)
        # every output element starts at its bias: output_padding's trailing ones receive nothing else
        body = head + f"{at('Y', y, index)} = {'B[oc]' if 'B' in node.in_connectors else '0'};\n" + tail
        body += _conv_transpose_loops(
            node,
            x,
            w,
            y,
            f"const auto xv = {_element('X', x, ['b', 'ic'], 'i')};\n",
            f"{_element('Y', y, ['b', 'oc'], 'o')} += xv * {_element('W', w, ['ic', 'wc'], 'k')};\n",
        )
        return cpp_expansion(node, state, sdfg, body)


@autoregister_params(op="ConvTranspose", name="dcnb")
class ConvTransposeBackward(BackwardImplementation):
    # gap: DaCe has no backward for ConvTranspose (its expansion above is a C++ loop autodiff cannot read)
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return _transpose_applies(node, in_desc_with_name(node, state, sdfg, "X"))

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        x, w = forward_in(forward_node, context, "X"), forward_in(forward_node, context, "W")
        y = forward_out(forward_node, context, "Y")
        wanted = [n for n in ("X", "W", "B") if n in required_gradients]
        if _uses_gemm(forward_node, x):
            return _conv_transpose_gemm_backward(forward_node, context, wanted)
        body = "".join(zero(f"{n}_grad", forward_in(forward_node, context, n)) for n in ("W", "B") if n in wanted)
        per_input = "double acc = 0;\n" if "X" in wanted else ""
        per_input += f"const auto xv = {_element('X', x, ['b', 'ic'], 'i')};\n" if "W" in wanted else ""
        inner = f"const auto dy = {_element('Y_grad', y, ['b', 'oc'], 'o')};\n"
        if "W" in wanted:
            inner += f"{_element('W_grad', w, ['ic', 'wc'], 'k')} += xv * dy;\n"
        if "X" in wanted:
            inner += f"acc += (double)dy * {_element('W', w, ['ic', 'wc'], 'k')};\n"
        after = f"{_element('X_grad', x, ['b', 'ic'], 'i')} = acc;\n" if "X" in wanted else ""
        if "X" in wanted or "W" in wanted:
            body += _conv_transpose_loops(forward_node, x, w, y, per_input, inner, after)
        if "B" in wanted:
            body += _bias_gradient(y)
        reads = [n for n in ("X", "W") if {"X": "W", "W": "X"}[n] in wanted]
        return cpp_backward(forward_node, context, ["Y_grad", *reads, *(f"{n}_grad" for n in wanted)], body)


default_backward("ConvTranspose")
