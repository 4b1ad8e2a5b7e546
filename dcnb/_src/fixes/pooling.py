"""Pooling ops over any number of spatial dimensions: AveragePool (expansion and backward) and MaxPool (expansion
and backward), as C++ loops over the windows."""

from __future__ import annotations

from dace import data as dt
from dace.autodiff.base_abc import BackwardImplementation
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.registry import autoregister_params
from dace.sdfg.utils import in_desc_with_name, out_desc_with_name

from .cpp import (
    at,
    cpp_backward,
    cpp_expansion,
    forward_in,
    forward_out,
    loops,
    offset,
    zero,
)
from .registry import default_backward, pure_expansion


def _pool_window(node, x: dt.Data) -> tuple[list[int], list[int], list[int], list[int]]:
    """Kernel, strides, leading pads and dilations of a pooling node over ``x`` (N, C, spatial...)."""
    rank = len(x.shape) - 2
    kernel = list(node.kernel_shape)
    strides = list(node.strides) if node.strides else [1] * rank
    pads = list(node.pads) if node.pads else [0] * (2 * rank)
    dilations = list(getattr(node, "dilations", None) or [1] * rank)
    return kernel, strides, pads[:rank], dilations


def _spatial(prefix: str, rank: int) -> list[str]:
    return [f"{prefix}{d}" for d in range(rank)]


def _average_pool_applies(node, x: dt.Data) -> bool:
    # ceil_mode needs nothing more: the output's shape says how many windows there are, and each is clipped below
    return (
        len(x.shape) >= 3
        and node.auto_pad == "NOTSET"
        and all(d == 1 for d in getattr(node, "dilations", None) or [])
    )


def _average_pool_loops(node, x: dt.Data, y: dt.Data, inner: str) -> str:
    """C++ visiting every (output element, input element of its window): ``inner`` sees ``xi``, ``yi`` and
    ``count``, the divisor PyTorch uses (the window clipped to the padded image, or only its part inside the
    image)."""
    kernel, strides, pads, _ = _pool_window(node, x)
    rank = len(x.shape) - 2
    out, image = _spatial("o", rank), _spatial("i", rank)
    head, tail = loops(["b", "c", *out], y.shape)
    body = head
    for d, (o, size) in enumerate(zip(out, x.shape[2:])):
        body += (
            f"const long long s{d} = {o} * {strides[d]} - {pads[d]};\n"
            f"const long long e{d} = std::min(s{d} + {kernel[d]}, {size}LL + {pads[d]});\n"
            f"const long long a{d} = s{d} > 0 ? s{d} : 0, z{d} = e{d} < {size} ? e{d} : {size};\n"
        )
    include_pad = bool(node.count_include_pad)
    count = " * ".join(f"(e{d} - s{d})" if include_pad else f"(z{d} - a{d})" for d in range(rank))
    body += f"const long long count = {count};\n"
    body += f"const long long yi = {offset(y, ['b', 'c', *out])};\n"
    body += "".join(f"for (long long {i} = a{d}; {i} < z{d}; ++{i})\n" for d, i in enumerate(image))
    body += "{\n" + f"const long long xi = {offset(x, ['b', 'c', *image])};\n" + inner + "}\n"
    return body + tail


@pure_expansion("AveragePool")
class AveragePoolExpansion(ONNXForward):
    # gap: DaCe has no implementation of the ONNX op AveragePool (F.avg_pool1d/2d/3d, nn.AvgPool*)
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


def _max_pool_applies(node, state, x: dt.Data) -> bool:
    # ceil_mode needs nothing more: the output's shape says how many windows there are, and each is clipped
    outputs = {e.src_conn for e in state.out_edges(node)}
    return "Indices" not in outputs and len(x.shape) >= 3 and node.auto_pad == "NOTSET" and not node.storage_order


def _argmax_loops(node, x: dt.Data, y: dt.Data, use: str) -> str:
    """C++ finding, for every output element, ``best``: the offset into ``x`` of the element PyTorch picks in its
    window (the first maximum, or the last NaN), -1 where the window holds none; ``use`` sees ``best``, ``top``
    and the output element ``b, c, o0..``."""
    kernel, strides, pads, dilations = _pool_window(node, x)
    rank = len(x.shape) - 2
    out, window, image = _spatial("o", rank), _spatial("k", rank), _spatial("i", rank)
    head, tail = loops(["b", "c", *out], y.shape)
    window_head, window_tail = loops(window, kernel)
    positions = "".join(
        f"const long long {i} = {o} * {s} - {p} + {k} * {d};\n"
        for i, o, k, s, p, d in zip(image, out, window, strides, pads, dilations)
    )
    outside = " || ".join(f"{i} < 0 || {i} >= {size}" for i, size in zip(image, x.shape[2:]))
    return (
        head
        + "long long best = -1; double top = 0;\n"
        + window_head
        + positions
        + f"if ({outside}) continue;\n"
        + f"const long long xi = {offset(x, ['b', 'c', *image])};\n"
        + "if (best < 0 || X[xi] > top || X[xi] != X[xi]) { best = xi; top = X[xi]; }\n"
        + window_tail
        + use
        + tail
    )


@pure_expansion("MaxPool", name="dcnb")
class MaxPoolExpansion(ONNXForward):
    # gap: DaCe's pure MaxPool covers 2-D images without dilation or ceil_mode only (F.max_pool1d was refused)
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return _max_pool_applies(node, state, in_desc_with_name(node, state, sdfg, "X"))

    @staticmethod
    def forward(node, state, sdfg):
        x, y = in_desc_with_name(node, state, sdfg, "X"), out_desc_with_name(node, state, sdfg, "Y")
        y_at = at("Y", y, ["b", "c", *_spatial("o", len(y.shape) - 2)])
        # the element read before choosing with it (fixes/cpp.py: GCC's masked loads)
        pick = f"const auto v = X[best >= 0 ? best : 0];\n{y_at} = best >= 0 ? v : -INFINITY;\n"
        body = _argmax_loops(node, x, y, pick)
        return cpp_expansion(node, state, sdfg, body)


@autoregister_params(op="MaxPool", name="dcnb")
class MaxPoolBackward(BackwardImplementation):
    # gap: DaCe's MaxPool backward writes each gradient at the argmax's offset inside the window, not inside the
    # image, and leaves the rest of the input gradient unwritten: every network with max pooling got wrong gradients
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return _max_pool_applies(node, state, in_desc_with_name(node, state, sdfg, "X"))

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        x, y = forward_in(forward_node, context, "X"), forward_out(forward_node, context, "Y")
        dy = at("Y_grad", y, ["b", "c", *_spatial("o", len(y.shape) - 2)])
        body = zero("X_grad", x) + _argmax_loops(forward_node, x, y, f"if (best >= 0) X_grad[best] += {dy};\n")
        return cpp_backward(forward_node, context, ["X", "Y_grad", "X_grad"], body)


default_backward("MaxPool")
