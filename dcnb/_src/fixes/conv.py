"""Convolutions: Conv's expansion and backward, as C++ loops."""

from __future__ import annotations

from dace import data as dt
from dace.autodiff.base_abc import BackwardImplementation
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.registry import autoregister_params
from dace.sdfg.utils import in_desc_with_name, out_desc_with_name

from .cpp import at, cpp_backward, cpp_expansion, forward_in, forward_out, loops, zero
from .registry import default_backward, pure_expansion


def _conv_applies(node, x: dt.Data) -> bool:
    return len(x.shape) == 4 and node.auto_pad == "NOTSET" and all(d == 1 for d in node.dilations or [])


def _conv_loops(node, x: dt.Data, w: dt.Data, y: dt.Data, per_output: str, inner: str, after: str = "") -> str:
    """C++ visiting every output element of a 2-D convolution (``per_output`` and ``after`` see ``b, m, oh, ow``)
    and every input element it reads (``inner`` also sees ``c, kh, kw`` and the input element ``b, ci, h, w_``)."""
    groups = node.group or 1
    strides = list(node.strides) if node.strides else [1, 1]
    pads = list(node.pads) if node.pads else [0, 0, 0, 0]
    per_group_in, per_group_out = x.shape[1] // groups, w.shape[0] // groups
    head, tail = loops(["b", "m", "oh", "ow"], y.shape)
    inner_head, inner_tail = loops(["c", "kh", "kw"], [per_group_in, w.shape[2], w.shape[3]])
    return (
        head
        + per_output
        + inner_head
        + f"const long long ci = (m / {per_group_out}) * {per_group_in} + c;\n"
        + f"const long long h = oh * {strides[0]} - {pads[0]} + kh, w_ = ow * {strides[1]} - {pads[1]} + kw;\n"
        + f"if (h < 0 || h >= {x.shape[2]} || w_ < 0 || w_ >= {x.shape[3]}) continue;\n"
        + inner
        + inner_tail
        + after
        + tail
    )


@pure_expansion("Conv", name="dcnb")
class ConvExpansion(ONNXForward):
    # gap: DaCe's pure Conv takes the output's height bound from its width and the strides the other way round,
    # so a convolution with a non-square output or unequal strides computed wrong values
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return _conv_applies(node, in_desc_with_name(node, state, sdfg, "X"))

    @staticmethod
    def forward(node, state, sdfg):
        x, w = in_desc_with_name(node, state, sdfg, "X"), in_desc_with_name(node, state, sdfg, "W")
        y = out_desc_with_name(node, state, sdfg, "Y")
        body = _conv_loops(
            node,
            x,
            w,
            y,
            f"double acc = {'B[m]' if 'B' in node.in_connectors else '0'};\n",
            f"acc += (double){at('W', w, ['m', 'c', 'kh', 'kw'])} * {at('X', x, ['b', 'ci', 'h', 'w_'])};\n",
            f"{at('Y', y, ['b', 'm', 'oh', 'ow'])} = acc;\n",
        )
        return cpp_expansion(node, state, sdfg, body)


@autoregister_params(op="Conv", name="dcnb")
class ConvBackward(BackwardImplementation):
    # gap: DaCe's only Conv backward calls ATen's CUDA depthwise kernel (at::thnn_conv_depthwise2d_backward_out),
    # which does not compile on CPU: every network with a convolution failed to build its backward
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return _conv_applies(node, in_desc_with_name(node, state, sdfg, "X"))

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        x, w = forward_in(forward_node, context, "X"), forward_in(forward_node, context, "W")
        y = forward_out(forward_node, context, "Y")
        wanted = [n for n in ("X", "W", "B") if n in required_gradients]
        body = "".join(zero(f"{n}_grad", forward_in(forward_node, context, n)) for n in wanted)
        per_output = f"const auto dy = {at('Y_grad', y, ['b', 'm', 'oh', 'ow'])};\n"
        per_output += "B_grad[m] += dy;\n" if "B" in wanted else ""
        inner = ""
        if "W" in wanted:
            inner += f"{at('W_grad', w, ['m', 'c', 'kh', 'kw'])} += dy * {at('X', x, ['b', 'ci', 'h', 'w_'])};\n"
        if "X" in wanted:
            inner += f"{at('X_grad', x, ['b', 'ci', 'h', 'w_'])} += dy * {at('W', w, ['m', 'c', 'kh', 'kw'])};\n"
        body += _conv_loops(forward_node, x, w, y, per_output, inner)
        reads = [n for n in ("X", "W") if {"X": "W", "W": "X"}[n] in wanted]
        return cpp_backward(forward_node, context, ["Y_grad", *reads, *(f"{n}_grad" for n in wanted)], body)


default_backward("Conv")
