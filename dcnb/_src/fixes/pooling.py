"""Pooling ops over any number of spatial dimensions: AveragePool (expansion and backward) and MaxPool (expansion
and backward), as C++ loops over the windows."""

from __future__ import annotations

import math

import dace
import dace.autodiff.utils as autodiff_utils
from dace import data as dt
from dace.autodiff.base_abc import BackwardImplementation
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.libraries.onnx.op_implementations.img_op_implementations import PureGlobalAveragePool
from dace.properties import ListProperty, Property
from dace.registry import autoregister_params
from dace.sdfg import nodes
from dace.sdfg.utils import in_desc_with_name, out_desc_with_name
from dace.transformation.transformation import ExpandTransformation

from .. import gpu_libs
from .cpp import (
    at,
    channels_last,
    cpp_expansion,
    kept_nested,
    loops,
    offset,
    parallel_for,
    simd,
)
from .library_nodes import (
    backward_node,
    concrete,
    connected,
    cudnn_type,
    library_call,
    loops_on_gpu,
    shape,
)
from .registry import CHOOSE, choice, default_backward, on_cpu, on_gpu_host, pure_expansion


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


def _planes(y: dt.Data, out: list[str], zeroed: tuple[str, dt.Data] | None = None) -> tuple[str, str]:
    """Loops over each image plane (b, c) of ``y``, spread over the threads (no window reaches another plane),
    zeroing the plane of ``zeroed`` (a name and its array) first, then over its output elements ``out``. Over
    channels-last images the channels are innermost, and an image is a thread's: a plane's elements are C apart
    there, and windows that add into an array overlap within an image."""
    per_image = _per_image(y, zeroed)
    if per_image is not None:
        inner_head, inner_tail = loops([*out, "c"], [*y.shape[2:], y.shape[1]])
        return per_image + inner_head, inner_tail + "}\n"
    head, tail = loops(["b", "c"], y.shape[:2])
    inner_head, inner_tail = loops(out, y.shape[2:])
    plane = _zero_plane(*zeroed) if zeroed else ""
    return parallel_for(collapse=2) + head + plane + inner_head, inner_tail + tail


def _per_image(y: dt.Data, zeroed: tuple[str, dt.Data] | None) -> str | None:
    """Over channels-last images (``y``, and the array of ``zeroed``): C++ opening a loop that gives each thread an
    image ``b``, its image of ``zeroed`` zeroed first (``_planes``); None over images of another layout."""
    if not (channels_last(y) and (zeroed is None or channels_last(zeroed[1]))):
        return None
    head = parallel_for() + f"for (long long b = 0; b < {y.shape[0]}; ++b) {{\n"
    return head + (_zero_image(*zeroed) if zeroed else "")


def _zero_plane(name: str, desc: dt.Data) -> str:
    """C++ zeroing the plane (b, c) of ``name``."""
    spatial = _spatial("__z", len(desc.shape) - 2)
    head, tail = loops(spatial, desc.shape[2:])
    return head + f"{at(name, desc, ['b', 'c', *spatial])} = 0;\n" + tail


def _zero_image(name: str, desc: dt.Data) -> str:
    """C++ zeroing the image b of ``name``, in memory order (channels last)."""
    spatial = _spatial("__z", len(desc.shape) - 2)
    head, tail = loops([*spatial, "__zc"], [*desc.shape[2:], desc.shape[1]])
    return head + f"{at(name, desc, ['b', '__zc', *spatial])} = 0;\n" + tail


def _average_pool_loops(node, x: dt.Data, y: dt.Data, inner: str, zeroed: tuple[str, dt.Data] | None = None) -> str:
    """C++ visiting every (output element, input element of its window): ``inner`` sees ``xi``, ``yi`` and
    ``count``, the divisor PyTorch uses (the window clipped to the padded image, or only its part inside the
    image); ``zeroed`` is zeroed before the windows (``_planes``)."""
    kernel, strides, pads, _ = _pool_window(node, x)
    rank = len(x.shape) - 2
    out, image = _spatial("o", rank), _spatial("i", rank)
    head, tail = _planes(y, out, zeroed)
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
        return Pooling(node.label, inputs={"X"}, outputs={"Y"}, **_attributes(node, "average"))


@autoregister_params(op="AveragePool", name="dcnb")
class AveragePoolBackward(BackwardImplementation):
    # gap: DaCe has no backward for AveragePool (its expansion above is a C++ loop autodiff cannot read)
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return _average_pool_applies(node, in_desc_with_name(node, state, sdfg, "X"))

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        return _pooling_backward(forward_node, context, "average", ["Y_grad"])


default_backward("AveragePool")


def _max_pool_applies(node, state, x: dt.Data) -> bool:
    # ceil_mode needs nothing more: the output's shape says how many windows there are, and each is clipped
    outputs = {e.src_conn for e in state.out_edges(node)}
    return "Indices" not in outputs and len(x.shape) >= 3 and node.auto_pad == "NOTSET" and not node.storage_order


def _argmax_loops(node, x: dt.Data, y: dt.Data, use: str, zeroed: tuple[str, dt.Data] | None = None) -> str:
    """C++ finding, for every output element, ``best``: the offset into ``x`` of the element PyTorch picks in its
    window (the first maximum, or the last NaN), -1 where the window holds none; ``use`` sees ``best``, ``top``
    and the output element ``b, c, o0..``; ``zeroed`` is zeroed before the windows (``_planes``)."""
    kernel, strides, pads, dilations = _pool_window(node, x)
    rank = len(x.shape) - 2
    out, window, image = _spatial("o", rank), _spatial("k", rank), _spatial("i", rank)
    window_head, window_tail = loops(window, kernel)
    positions = "".join(
        f"const long long {i} = {o} * {s} - {p} + {k} * {d};\n"
        for i, o, k, s, p, d in zip(image, out, window, strides, pads, dilations)
    )
    outside = " || ".join(f"{i} < 0 || {i} >= {size}" for i, size in zip(image, x.shape[2:]))
    per_image = _per_image(y, zeroed) if channels_last(x) else None
    if per_image is not None:
        # a pixel's windows compared a vector of channels at a time, each channel's choice kept in _best and _top
        channels = int(y.shape[1])
        over_channels = simd() + f"for (long long c = 0; c < {channels}; ++c) {{\n"
        head = per_image + f"long long* _best = new long long[{channels}];\ndouble* _top = new double[{channels}];\n"
        pixels, pixels_end = loops(out, y.shape[2:])
        take = "const bool take = _best[c] < 0 || v > _top[c] || v != v;\n"
        return (
            head
            + pixels
            + over_channels
            + "_best[c] = -1;\n_top[c] = 0;\n}\n"
            + window_head
            + positions
            + f"if ({outside}) continue;\n"
            + f"const long long _xb = {offset(x, ['b', '0', *image])};\n"
            + over_channels
            + "const long long xi = _xb + c;\nconst double v = X[xi];\n"
            + take
            + "_best[c] = take ? xi : _best[c];\n_top[c] = take ? v : _top[c];\n}\n"
            + window_tail
            + f"for (long long c = 0; c < {channels}; ++c) {{\n"
            + "const long long best = _best[c];\nconst double top = _top[c];\n"
            + use
            + "}\n"
            + pixels_end
            + "delete[] _best;\ndelete[] _top;\n}\n"
        )
    head, tail = _planes(y, out, zeroed)
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
        return Pooling(node.label, inputs={"X"}, outputs={"Y"}, **_attributes(node, "max"))


@autoregister_params(op="MaxPool", name="dcnb")
class MaxPoolBackward(BackwardImplementation):
    # gap: DaCe's MaxPool backward writes each gradient at the argmax's offset inside the window, not inside the
    # image, and leaves the rest of the input gradient unwritten: every network with max pooling got wrong gradients
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return _max_pool_applies(node, state, in_desc_with_name(node, state, sdfg, "X"))

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        return _pooling_backward(forward_node, context, "max", ["X", "Y_grad"])


@pure_expansion("GlobalAveragePool", name="dcnb")
class GlobalAveragePoolExpansion(ONNXForward):
    # gap: DaCe's GlobalAveragePool is a ReduceMean, a loop per (n, c) over its pixels, which over a channels-last
    # image (a squeeze-and-excitation's, laid out by actions/layout.py) reads each element C apart
    @staticmethod
    def forward(node, state, sdfg):
        x, y = in_desc_with_name(node, state, sdfg, "X"), out_desc_with_name(node, state, sdfg, "Y")
        if not (channels_last(x) and on_cpu(node, state, sdfg)):
            return PureGlobalAveragePool.forward(node, state, sdfg)
        # per image, its pixels in memory order, a vector loop over the channels summing in doubles
        channels, pixels, corner = int(x.shape[1]), math.prod(int(n) for n in x.shape[2:]), ["0"] * (len(x.shape) - 2)
        body = parallel_for() + f"for (long long b = 0; b < {x.shape[0]}; ++b) {{\n"
        body += f"double* _sums = new double[{channels}]();\nconst auto* _x = &{at('X', x, ['b', '0', *corner])};\n"
        body += f"for (long long _p = 0; _p < {pixels}; ++_p) {{\n" + simd()
        body += f"for (long long c = 0; c < {channels}; ++c) _sums[c] += _x[_p * {channels} + c];\n}}\n"
        body += f"for (long long c = 0; c < {channels}; ++c) {at('Y', y, ['b', 'c', *corner])} = _sums[c] / {pixels};\n"
        return cpp_expansion(node, state, sdfg, body + "delete[] _sums;\n}\n")


def _attributes(node, mode: str) -> dict:
    """A Pooling node's attributes for the ONNX pooling op ``node``."""
    rank = len(node.kernel_shape)
    return {
        "mode": mode,
        "kernel_shape": list(node.kernel_shape),
        "strides": list(node.strides) if node.strides else [1] * rank,
        "pads": list(node.pads) if node.pads else [0] * (2 * rank),
        "dilations": list(getattr(node, "dilations", None) or [1] * rank),
        "count_include_pad": bool(getattr(node, "count_include_pad", 0)),
    }


def _pooling_backward(forward_node, context, mode: str, reads: list[str]):
    node, result = autodiff_utils.add_empty_sdfg_for_node(forward_node, [*reads, "X_grad"], context)
    pooling = Pooling(f"{forward_node.label}_backward", **_attributes(forward_node, mode))
    backward_node(node, pooling, reads, ["X_grad"])
    return node, result


def _pooling_loops(pooling, state, sdfg) -> dace.SDFG:
    """A Pooling node's C++ loops over the windows, forward or backward."""
    arrays = connected(pooling, state, sdfg)
    if "Y" in arrays:
        x, y = arrays["X"], arrays["Y"]
        if pooling.mode == "average":
            body = _average_pool_loops(pooling, x, y, "Y[yi] += X[xi] / count;\n", ("Y", y))
        else:
            y_at = at("Y", y, ["b", "c", *_spatial("o", len(y.shape) - 2)])
            # the element read before choosing with it (fixes/cpp.py: GCC's masked loads)
            pick = f"const auto v = X[best >= 0 ? best : 0];\n{y_at} = best >= 0 ? v : -INFINITY;\n"
            body = _argmax_loops(pooling, x, y, pick)
        return loops_on_gpu(pooling, state, sdfg, cpp_expansion(pooling, state, sdfg, body))
    x, y = arrays["X_grad"], arrays["Y_grad"]
    if pooling.mode == "average":
        body = _average_pool_loops(pooling, x, y, "X_grad[xi] += Y_grad[yi] / count;\n", ("X_grad", x))
    else:
        dy = at("Y_grad", y, ["b", "c", *_spatial("o", len(y.shape) - 2)])
        scatter = f"if (best >= 0) X_grad[best] += {dy};\n"
        body = _argmax_loops(pooling, arrays["X"], y, scatter, ("X_grad", x))
    return loops_on_gpu(pooling, state, sdfg, cpp_expansion(pooling, state, sdfg, body))


def _cudnn_applies(pooling, state, sdfg) -> bool:
    """Whether cuDNN's pooling computes what the loops do: GPU memory outside kernels, float32 or float64, 1 to 3
    spatial dimensions, numbers for shapes and strides, no dilation, the same pad on both sides of each dimension,
    as many windows as cuDNN's floor division gives (ceil_mode's extra windows, clipped, are the loops'), and no
    array of one element (which DaCe passes by value)."""
    if not on_gpu_host(pooling, state, sdfg):
        return False
    arrays = connected(pooling, state, sdfg)
    descs = list(arrays.values())
    if len({d.dtype for d in descs}) != 1 or descs[0].dtype not in (dace.float32, dace.float64):
        return False
    if not all(map(concrete, descs)) or any(math.prod(int(n) for n in d.shape) == 1 for d in descs):
        return False
    x = [arrays[n] for n in ("X", "X_grad") if n in arrays]
    y = [arrays[n] for n in ("Y", "Y_grad") if n in arrays]
    if not 3 <= len(x[0].shape) <= 5 or any(len({tuple(map(int, d.strides)) for d in same}) != 1 for same in (x, y)):
        return False
    rank = len(pooling.kernel_shape)
    if any(d != 1 for d in pooling.dilations) or pooling.pads[:rank] != pooling.pads[rank:]:
        return False
    sizes = zip(x[0].shape[2:], y[0].shape[2:], pooling.kernel_shape, pooling.strides, pooling.pads)
    return all((int(n) + 2 * p - k) // s + 1 == int(out) for n, out, k, s, p in sizes)


def _cudnn_call(pooling, state, sdfg) -> nodes.Tasklet:
    """cuDNN's pooling forward, or its gradient (a max pooling's output recomputed for it, into memory allocated
    once when the binary is loaded), descriptors made then."""
    arrays = connected(pooling, state, sdfg)
    forward = "Y" in arrays
    x, y = arrays["X" if forward else "X_grad"], arrays["Y" if forward else "Y_grad"]
    rank = len(pooling.kernel_shape)
    if pooling.mode == "max":
        mode = "CUDNN_POOLING_MAX_DETERMINISTIC"  # one element of a window gets its gradient, as in PyTorch
    elif pooling.count_include_pad:
        mode = "CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING"
    else:
        mode = "CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING"
    recomputed = 0 if forward or pooling.mode != "max" else math.prod(int(n) for n in y.shape) * y.dtype.bytes
    create = (
        f"FIELD.create({cudnn_type(x)}, {shape(x)}, {shape(y)}, {mode}, "
        f"dcnb_gpu::Spatial({gpu_libs.dims(pooling.kernel_shape)}, 1), "
        f"dcnb_gpu::Spatial({gpu_libs.dims(pooling.pads[:rank])}, 0), "
        f"dcnb_gpu::Spatial({gpu_libs.dims(pooling.strides)}, 1), {recomputed})"
    )
    ctype = x.dtype.ctype
    if forward:
        call = f"FIELD.forward<{ctype}>(__state->dcnb_cudnn, __dace_current_stream, X, Y)"
    else:
        source = "X" if pooling.mode == "max" else f"({ctype} *)nullptr"
        call = f"FIELD.backward<{ctype}>(__state->dcnb_cudnn, __dace_current_stream, Y_grad, {source}, X_grad)"
    return library_call(pooling, state, sdfg, "pool", "dcnb_gpu::Pooling", create, call)


@dace.library.expansion
class ExpandPoolingLoops(ExpandTransformation):
    # gap: DaCe has no AveragePool and a MaxPool of 2-D images without dilation or ceil_mode (see the ONNX ops'
    # expansions above): C++ loops over the windows, any number of dimensions
    environments = []
    expansion = staticmethod(_pooling_loops)
    postprocessing = staticmethod(lambda sdfg, state, nested: kept_nested(nested))


@dace.library.expansion
class ExpandPoolingCudnn(ExpandTransformation):
    # gap: in CUDA builds the loops ran as one-thread kernels: cuDNN's pooling where its semantics are PyTorch's
    environments = [gpu_libs.CuDNN]
    expansion = staticmethod(_cudnn_call)


@dace.library.expansion
class ExpandPoolingChoice(ExpandTransformation):
    # gap: which code a pooling gets depends on where the build placed it, known only at code generation
    environments = []
    expansion = choice(lambda pooling, state, sdfg: "cudnn" if _cudnn_applies(pooling, state, sdfg) else "loops")


@dace.library.node
class Pooling(nodes.LibraryNode):
    """Max or average pooling, forward (X -> Y) or its gradient (X for a max pooling, Y_grad -> X_grad); the
    attributes are the ONNX op's (``pads``: leading ones, then trailing ones)."""

    implementations = {"loops": ExpandPoolingLoops, "cudnn": ExpandPoolingCudnn, CHOOSE: ExpandPoolingChoice}
    default_implementation = CHOOSE

    mode = Property(dtype=str, default="max", choices=["max", "average"])
    kernel_shape = ListProperty(element_type=int, default=[])
    strides = ListProperty(element_type=int, default=[])
    pads = ListProperty(element_type=int, default=[])
    dilations = ListProperty(element_type=int, default=[])
    count_include_pad = Property(dtype=bool, default=False)

    def __init__(self, name, inputs=None, outputs=None, mode="max", kernel_shape=(), strides=(), pads=(),
                 dilations=(), count_include_pad=False):
        super().__init__(name, inputs=inputs or set(), outputs=outputs or set())
        self.mode, self.count_include_pad = mode, count_include_pad
        self.kernel_shape, self.strides, self.pads, self.dilations = (
            list(kernel_shape), list(strides), list(pads), list(dilations)
        )


default_backward("MaxPool")
