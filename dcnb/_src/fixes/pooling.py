"""Pooling ops: AveragePool (expansion and backward) and MaxPool's backward, as C++ loops over the windows."""

from __future__ import annotations

from dace import data as dt
from dace.autodiff.base_abc import BackwardImplementation
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.registry import autoregister_params
from dace.sdfg.utils import in_desc_with_name, out_desc_with_name

from .cpp import at, cpp_backward, cpp_expansion, forward_in, forward_out, loops, offset, zero
from .registry import default_backward, pure_expansion


def _pool_window(node, x: dt.Data) -> tuple[list[int], list[int], list[int]]:
    """Kernel, strides and leading pads of a 2-D pooling node."""
    kernel = list(node.kernel_shape)
    strides = list(node.strides) if node.strides else [1, 1]
    pads = list(node.pads) if node.pads else [0, 0, 0, 0]
    return kernel, strides, pads[:2]


def _average_pool_applies(node, x: dt.Data) -> bool:
    return (
        len(x.shape) == 4
        and node.auto_pad == "NOTSET"
        and not node.ceil_mode
        and all(d == 1 for d in getattr(node, "dilations", None) or [])
    )


def _average_pool_loops(node, x: dt.Data, y: dt.Data, inner: str) -> str:
    """C++ visiting every (output element, input element of its window): ``inner`` sees ``xi``, ``yi`` and
    ``count``, the divisor PyTorch uses (the window, or only its part inside the image)."""
    kernel, strides, pads = _pool_window(node, x)
    head, tail = loops(["b", "c", "oh", "ow"], y.shape)
    include_pad = bool(node.count_include_pad)
    return (
        head
        + f"const long long h0 = oh * {strides[0]} - {pads[0]}, w0 = ow * {strides[1]} - {pads[1]};\n"
        + f"const long long h1 = h0 + {kernel[0]} < {x.shape[2]} + {pads[0]} ? h0 + {kernel[0]} : {x.shape[2]} + {pads[0]};\n"
        + f"const long long w1 = w0 + {kernel[1]} < {x.shape[3]} + {pads[1]} ? w0 + {kernel[1]} : {x.shape[3]} + {pads[1]};\n"
        + "const long long hs = h0 > 0 ? h0 : 0, ws = w0 > 0 ? w0 : 0;\n"
        + f"const long long he = h1 < {x.shape[2]} ? h1 : {x.shape[2]}, we = w1 < {x.shape[3]} ? w1 : {x.shape[3]};\n"
        + f"const long long count = {'(h1 - h0) * (w1 - w0)' if include_pad else '(he - hs) * (we - ws)'};\n"
        + f"const long long yi = {offset(y, ['b', 'c', 'oh', 'ow'])};\n"
        + "for (long long h = hs; h < he; ++h) for (long long w = ws; w < we; ++w) {\n"
        + f"const long long xi = {offset(x, ['b', 'c', 'h', 'w'])};\n"
        + inner
        + "}\n"
        + tail
    )


@pure_expansion("AveragePool")
class AveragePoolExpansion(ONNXForward):
    # gap: DaCe has no implementation of the ONNX op AveragePool (F.avg_pool2d, nn.AvgPool2d)
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return _average_pool_applies(node, in_desc_with_name(node, state, sdfg, "X"))

    @staticmethod
    def forward(node, state, sdfg):
        x, y = in_desc_with_name(node, state, sdfg, "X"), out_desc_with_name(node, state, sdfg, "Y")
        body = zero("Y", y) + _average_pool_loops(node, x, y, "Y[yi] += X[xi] / count;\n")
        return cpp_expansion(node, state, sdfg, body)


@autoregister_params(op="AveragePool", name="dcnb")
class AveragePoolBackward(BackwardImplementation):
    # gap: DaCe has no backward for AveragePool (its expansion above is a C++ loop autodiff cannot read)
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return _average_pool_applies(node, in_desc_with_name(node, state, sdfg, "X"))

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        x, y = forward_in(forward_node, context, "X"), forward_out(forward_node, context, "Y")
        body = zero("X_grad", x) + _average_pool_loops(forward_node, x, y, "X_grad[xi] += Y_grad[yi] / count;\n")
        return cpp_backward(forward_node, context, ["Y_grad", "X_grad"], body)


default_backward("AveragePool")


def _max_pool_applies(node, x: dt.Data) -> bool:
    return (
        len(x.shape) == 4
        and node.auto_pad == "NOTSET"
        and not node.ceil_mode
        and not node.storage_order
        and all(d == 1 for d in node.dilations or [])
    )


@autoregister_params(op="MaxPool", name="dcnb")
class MaxPoolBackward(BackwardImplementation):
    # gap: DaCe's MaxPool backward writes each gradient at the argmax's offset inside the window, not inside the
    # image, and leaves the rest of the input gradient unwritten: every network with max pooling got wrong gradients
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        outputs = {e.src_conn for e in state.out_edges(node)}
        return "Indices" not in outputs and _max_pool_applies(node, in_desc_with_name(node, state, sdfg, "X"))

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        x, y = forward_in(forward_node, context, "X"), forward_out(forward_node, context, "Y")
        kernel, strides, pads = _pool_window(forward_node, x)
        head, tail = loops(["b", "c", "oh", "ow"], y.shape)
        body = (
            zero("X_grad", x)
            + head
            + "long long best = -1; double top = 0;\n"
            + f"for (long long kh = 0; kh < {kernel[0]}; ++kh) for (long long kw = 0; kw < {kernel[1]}; ++kw) {{\n"
            + f"const long long h = oh * {strides[0]} - {pads[0]} + kh, w = ow * {strides[1]} - {pads[1]} + kw;\n"
            + f"if (h < 0 || h >= {x.shape[2]} || w < 0 || w >= {x.shape[3]}) continue;\n"
            + f"const long long xi = {offset(x, ['b', 'c', 'h', 'w'])};\n"
            # the element PyTorch picks: the first maximum in the window, or its last NaN
            + "if (best < 0 || X[xi] > top || X[xi] != X[xi]) { best = xi; top = X[xi]; }\n"
            + "}\n"
            + f"if (best >= 0) X_grad[best] += {at('Y_grad', y, ['b', 'c', 'oh', 'ow'])};\n"
            + tail
        )
        return cpp_backward(forward_node, context, ["X", "Y_grad", "X_grad"], body)


default_backward("MaxPool")
