"""Fixes for gaps in DaCe 2.0.0b1, made through its own extension points: pure expansions registered for ONNX
ops it cannot expand, backward rules registered for ops whose derivative it lacks or gets wrong, and passes over
the SDFGs around autodiff. One class or function per gap, each named for it, with a one-line comment naming the
gap, and each tested in tests/compile/test_opfixes.py.

Importing this module installs the expansions and backward rules; program.differentiate runs the passes.
"""

from __future__ import annotations

import ast
import copy
import functools
import math

import dace
import numpy as np
import dace.autodiff.utils as autodiff_utils
from dace import data as dt
from dace.autodiff.base_abc import BackwardContext, BackwardImplementation, BackwardResult
from dace.autodiff.implementations.onnx_ops import DefaultEinsumBackward
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.libraries.onnx.nodes.onnx_op import ONNXOp
from dace.libraries.onnx.nodes.onnx_op_registry import get_onnx_node
from dace.libraries.onnx.op_implementations.img_op_implementations import PureBatchNormalization
from dace.libraries.onnx.op_implementations.utils import program_for_node
from dace.properties import CodeBlock
from dace.registry import autoregister_params
from dace.sdfg import nodes
from dace.sdfg.utils import in_desc_with_name, out_desc_with_name
from dace.transformation.transformation import ExpandTransformation

from .frontend import OPSET

# --- helpers: registering with DaCe, C++ loops over described arrays ------------------------------------------


def _op_versions(op: str) -> list[type[ONNXOp]]:
    """The classes DaCe generated for an ONNX op: one per version of its schema up to our export's opset, and the
    newest, which DaCe's own rules instantiate."""
    versions = []
    for version in [*range(1, OPSET + 1), -1]:
        try:
            cls = get_onnx_node(op, version)
        except ValueError:
            continue
        if cls not in versions:
            versions.append(cls)
    return versions


def _pure_expansion(op: str, name: str = "pure"):
    """Register an ONNXForward class as the expansion of ``op`` that DaCe's ONNX library expands to by default:
    as "pure" where DaCe has none, else under ``name``, made the op's default.

    DaCe's own ``@op_implementation`` only takes effect before its op registry is first built, which importing
    the ONNX importer already does, so the expansion is attached to the generated op classes directly.
    """

    def register(impl: type[ONNXForward]) -> type[ONNXForward]:
        for cls in _op_versions(op):
            class_name = f"{cls.__name__}_Expansion_dcnb"
            expansion = type(
                class_name,
                (ExpandTransformation,),
                {
                    "environments": [],
                    "forward_impl": impl,  # as DaCe's own expansions name it
                    "expansion": staticmethod(functools.partial(_expand, op, impl)),
                },
            )
            globals()[class_name] = expansion  # where DaCe looks for it when it loads an SDFG that names it
            cls.register_implementation(name, expansion)
            if name != "pure":
                cls.default_implementation = name
        return impl

    return register


def _expand(op: str, impl: type[ONNXForward], node: ONNXOp, state, sdfg, *args, **kwargs):
    if not impl.forward_can_be_applied(node, state, sdfg):
        raise NotImplementedError(f"the ONNX op {op} of {node.label} uses attributes dcnb's expansion does not cover")
    return impl.forward(node, state, sdfg)


def _default_backward(op: str, name: str = "dcnb") -> None:
    """Make the backward rule registered as ``name`` the one autodiff picks for ``op`` where it applies."""
    for cls in _op_versions(op):
        cls.default_backward_implementation = name


def _contiguous(desc: dt.Data) -> bool:
    if isinstance(desc, dt.Scalar):
        return True
    expected, stride = [], 1
    for size in reversed(desc.shape):
        expected.insert(0, stride)
        stride *= size
    return all(int(a) == b for a, b in zip(desc.strides, expected))


def _offset(desc: dt.Data, index: list[str]) -> str:
    """C++ for the element offset of ``index`` in an array with ``desc``'s strides."""
    if isinstance(desc, dt.Scalar) or not index:
        return "0"
    return " + ".join(f"({i}) * {s}" for i, s in zip(index, desc.strides))


def _at(name: str, desc: dt.Data, index: list[str]) -> str:
    """C++ for an element of an array that a tasklet reaches through the pointer ``name``."""
    return f"{name}[{_offset(desc, index)}]"


def _loops(variables: list[str], sizes: list) -> tuple[str, str]:
    head = "".join(f"for (long long {v} = 0; {v} < {s}; ++{v}) {{\n" for v, s in zip(variables, sizes))
    return head, "}\n" * len(variables)


def _cpp_tasklet(sdfg: dace.SDFG, label: str, inputs: list[str], outputs: list[str], body: str) -> None:
    """Add a state to ``sdfg`` running ``body`` (C++) over its arrays, each reachable in ``body`` as a pointer
    of its own name."""
    state = sdfg.add_state()
    # the names are declared in a block of their own: they shadow the SDFG's arguments, which DaCe assigns
    # scalar outputs to after the tasklet
    results, prologue, epilogue = [], ["{"], []
    for n in inputs + outputs:
        desc = sdfg.arrays[n]
        ctype = desc.dtype.ctype
        if isinstance(desc, dt.Scalar):
            prologue.append(f"{ctype} {n}[1] = {{{'_c_' + n if n in inputs else '0'}}};")
            if n in outputs:
                results.append(f"{ctype} _r_{n};")
                epilogue.append(f"_r_{n} = {n}[0];")
        else:
            qualifier = "const " if n in inputs else ""
            prologue.append(f"{qualifier}{ctype}* {n} = _c_{n};")
    epilogue.append("}")
    epilogue.extend(f"_c_{n} = _r_{n};" for n in outputs if isinstance(sdfg.arrays[n], dt.Scalar))
    tasklet = state.add_tasklet(
        label,
        {f"_c_{n}": _connector_type(sdfg.arrays[n]) for n in inputs},
        {f"_c_{n}": _connector_type(sdfg.arrays[n]) for n in outputs},
        "\n".join([*results, *prologue, body, *epilogue]),
        language=dace.Language.CPP,
    )
    for n in inputs:
        state.add_edge(state.add_read(n), None, tasklet, f"_c_{n}", dace.Memlet.from_array(n, sdfg.arrays[n]))
    for n in outputs:
        state.add_edge(tasklet, f"_c_{n}", state.add_write(n), None, dace.Memlet.from_array(n, sdfg.arrays[n]))


def _cpp_expansion(node: ONNXOp, state, sdfg, body: str) -> dace.SDFG:
    """The expansion of ``node`` into ``body`` (C++) over its connectors' arrays, named as the connectors."""
    nsdfg = dace.SDFG(f"{node.label}_expansion")
    inputs, outputs = [], []
    for edge, is_input in node.iter_edges(state):
        name = edge.dst_conn if is_input else edge.src_conn
        desc = copy.deepcopy(sdfg.arrays[edge.data.data])
        desc.transient = False
        nsdfg.add_datadesc(name, desc)
        (inputs if is_input else outputs).append(name)
    _cpp_tasklet(nsdfg, f"{node.label}_tasklet", inputs, outputs, body)
    return nsdfg


def _cpp_backward(
    forward_node: ONNXOp, context: BackwardContext, names: list[str], body: str
) -> tuple[nodes.NestedSDFG, BackwardResult]:
    """A backward node running ``body`` (C++) over the arrays in ``names`` (forward connectors, and with a
    ``_grad`` suffix their gradients), each reachable in ``body`` as a pointer of that name.

    Every gradient it produces must be written completely (zeroed first where it is accumulated).
    """
    node, result = autodiff_utils.add_empty_sdfg_for_node(forward_node, names, context)
    inputs = [n for n in names if n in node.in_connectors]
    outputs = [n for n in names if n in node.out_connectors]
    _cpp_tasklet(node.sdfg, f"{forward_node.label}_backward", inputs, outputs, body)
    return node, result


def _connector_type(desc: dt.Data):
    return desc.dtype if isinstance(desc, dt.Scalar) else dace.pointer(desc.dtype)


def _zero(name: str, desc: dt.Data) -> str:
    if isinstance(desc, dt.Scalar):
        return f"{name}[0] = 0;\n"
    variables = [f"__z{i}" for i in range(len(desc.shape))]
    head, tail = _loops(variables, desc.shape)
    return head + f"{_at(name, desc, variables)} = 0;\n" + tail


def _in(forward_node, context, name):
    return autodiff_utils.forward_in_desc_with_name(forward_node, context, name)


def _out(forward_node, context, name):
    return autodiff_utils.forward_out_desc_with_name(forward_node, context, name)


# --- expansions DaCe lacks ------------------------------------------------------------------------------------


@_pure_expansion("HardSigmoid")
class HardSigmoidExpansion(ONNXForward):
    # gap: DaCe has no implementation of the ONNX op HardSigmoid (nn.Hardsigmoid)
    @staticmethod
    def forward(node, state, sdfg):
        alpha, beta = node.alpha, node.beta
        return _elementwise(
            node, state, sdfg, lambda t: f"lambda x: max({t}(0), min({t}(1), {t}({alpha!r}) * x + {t}({beta!r})))"
        )


@_pure_expansion("HardSwish")
class HardSwishExpansion(ONNXForward):
    # gap: DaCe has no implementation of the ONNX op HardSwish (nn.Hardswish, MobileNetV3)
    @staticmethod
    def forward(node, state, sdfg):
        return _elementwise(node, state, sdfg, lambda t: f"lambda x: x * min(max(x + {t}(3), {t}(0)), {t}(6)) / {t}(6)")


def _elementwise(node, state, sdfg, lambda_for):
    """The op Y = f(X) as one elementwise map; ``lambda_for(t)`` is f's source, its constants typed as the input's
    dtype ``t`` (e.g. "dace.float32")."""
    fn = lambda_for(f"dace.{in_desc_with_name(node, state, sdfg, 'X').dtype.to_string()}")

    def prog(X, Y):
        Y[:] = dace.elementwise(fn, X)

    return program_for_node(prog, sdfg, state, node)


@_pure_expansion("BatchNormalization", name="dcnb")
class BatchNormalizationExpansion(ONNXForward):
    # gap: DaCe's pure BatchNormalization in training mode keeps 10% of the old running statistics where ONNX's
    # momentum (0.9 for PyTorch's 0.1) keeps 90%, and copies them back through a second state, which autodiff
    # (one state only) cannot take
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return PureBatchNormalization.forward_can_be_applied(node, state, sdfg)

    @staticmethod
    def forward(node, state, sdfg):
        if not node.training_mode:
            return PureBatchNormalization.forward(node, state, sdfg)
        x = in_desc_with_name(node, state, sdfg, "X")
        dtype = x.dtype
        channels = x.shape[1]
        axes = tuple(i for i in range(len(x.shape)) if i != 1)
        count = math.prod(int(x.shape[i]) for i in axes)
        per_channel = [channels] + [1] * (len(x.shape) - 2)
        # constants of the data's type: a Python float would make the arithmetic double
        scalar = dtype.type
        eps, inv_count, one = scalar(node.epsilon), scalar(1 / count), scalar(1)
        keep, take = scalar(node.momentum), scalar(1 - node.momentum)
        # PyTorch, whose BatchNorm the exporter writes here, keeps the unbiased variance as its running estimate
        take_unbiased = scalar((1 - node.momentum) * count / max(count - 1, 1))
        updates = {"running_mean", "running_var"} <= set(node.out_connectors)

        def normalize(X, scale, B, Y):
            mean = np.add.reduce(X, axis=axes) * inv_count
            centered = X - np.reshape(mean, per_channel)
            var = np.add.reduce(centered * centered, axis=axes) * inv_count
            # ``one``, not ``dtype(1)``: in float64 that is written ``double(1)``, which autodiff cannot parse
            inv_std = dace.elementwise(lambda v: one / sqrt(v + eps), np.reshape(var, per_channel))
            Y[:] = centered * inv_std * np.reshape(scale, per_channel) + np.reshape(B, per_channel)
            return mean, var

        if updates:

            def prog(X, scale, B, input_mean, input_var, Y, running_mean, running_var):
                mean, var = normalize(X, scale, B, Y)
                running_mean[:] = input_mean * keep + mean * take
                running_var[:] = input_var * keep + var * take_unbiased

        else:

            def prog(X, scale, B, Y):
                normalize(X, scale, B, Y)

        return program_for_node(prog, sdfg, state, node, extra_vars={"normalize": dace.program(normalize)})


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
    head, tail = _loops(["b", "c", "oh", "ow"], y.shape)
    include_pad = bool(node.count_include_pad)
    return (
        head
        + f"const long long h0 = oh * {strides[0]} - {pads[0]}, w0 = ow * {strides[1]} - {pads[1]};\n"
        + f"const long long h1 = h0 + {kernel[0]} < {x.shape[2]} + {pads[0]} ? h0 + {kernel[0]} : {x.shape[2]} + {pads[0]};\n"
        + f"const long long w1 = w0 + {kernel[1]} < {x.shape[3]} + {pads[1]} ? w0 + {kernel[1]} : {x.shape[3]} + {pads[1]};\n"
        + "const long long hs = h0 > 0 ? h0 : 0, ws = w0 > 0 ? w0 : 0;\n"
        + f"const long long he = h1 < {x.shape[2]} ? h1 : {x.shape[2]}, we = w1 < {x.shape[3]} ? w1 : {x.shape[3]};\n"
        + f"const long long count = {'(h1 - h0) * (w1 - w0)' if include_pad else '(he - hs) * (we - ws)'};\n"
        + f"const long long yi = {_offset(y, ['b', 'c', 'oh', 'ow'])};\n"
        + "for (long long h = hs; h < he; ++h) for (long long w = ws; w < we; ++w) {\n"
        + f"const long long xi = {_offset(x, ['b', 'c', 'h', 'w'])};\n"
        + inner
        + "}\n"
        + tail
    )


@_pure_expansion("AveragePool")
class AveragePoolExpansion(ONNXForward):
    # gap: DaCe has no implementation of the ONNX op AveragePool (F.avg_pool2d, nn.AvgPool2d)
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return _average_pool_applies(node, in_desc_with_name(node, state, sdfg, "X"))

    @staticmethod
    def forward(node, state, sdfg):
        x, y = in_desc_with_name(node, state, sdfg, "X"), out_desc_with_name(node, state, sdfg, "Y")
        body = _zero("Y", y) + _average_pool_loops(node, x, y, "Y[yi] += X[xi] / count;\n")
        return _cpp_expansion(node, state, sdfg, body)


# --- backward rules DaCe lacks or gets wrong ------------------------------------------------------------------


@autoregister_params(op="Einsum", name="dcnb")
class EinsumBackwardOfTransients(DefaultEinsumBackward):
    # gap: DaCe's Einsum backward copies the forward descriptors into its nested SDFG as they are, so an
    # einsum reading a transient (a Linear after another op, once inlined) gives an invalid SDFG
    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        node, result = DefaultEinsumBackward.backward(forward_node, context, given_gradients, required_gradients)
        for name in (*node.in_connectors, *node.out_connectors):
            node.sdfg.arrays[name].transient = False
        return node, result


_default_backward("Einsum")


@autoregister_params(op="AveragePool", name="dcnb")
class AveragePoolBackward(BackwardImplementation):
    # gap: DaCe has no backward for AveragePool (its expansion above is a C++ loop autodiff cannot read)
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return _average_pool_applies(node, in_desc_with_name(node, state, sdfg, "X"))

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        x, y = _in(forward_node, context, "X"), _out(forward_node, context, "Y")
        body = _zero("X_grad", x) + _average_pool_loops(forward_node, x, y, "X_grad[xi] += Y_grad[yi] / count;\n")
        return _cpp_backward(forward_node, context, ["Y_grad", "X_grad"], body)


_default_backward("AveragePool")


def _conv_applies(node, x: dt.Data) -> bool:
    return len(x.shape) == 4 and node.auto_pad == "NOTSET" and all(d == 1 for d in node.dilations or [])


def _conv_loops(node, x: dt.Data, w: dt.Data, y: dt.Data, per_output: str, inner: str, after: str = "") -> str:
    """C++ visiting every output element of a 2-D convolution (``per_output`` and ``after`` see ``b, m, oh, ow``)
    and every input element it reads (``inner`` also sees ``c, kh, kw`` and the input element ``b, ci, h, w_``)."""
    groups = node.group or 1
    strides = list(node.strides) if node.strides else [1, 1]
    pads = list(node.pads) if node.pads else [0, 0, 0, 0]
    per_group_in, per_group_out = x.shape[1] // groups, w.shape[0] // groups
    head, tail = _loops(["b", "m", "oh", "ow"], y.shape)
    inner_head, inner_tail = _loops(["c", "kh", "kw"], [per_group_in, w.shape[2], w.shape[3]])
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


@_pure_expansion("Conv", name="dcnb")
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
            f"acc += (double){_at('W', w, ['m', 'c', 'kh', 'kw'])} * {_at('X', x, ['b', 'ci', 'h', 'w_'])};\n",
            f"{_at('Y', y, ['b', 'm', 'oh', 'ow'])} = acc;\n",
        )
        return _cpp_expansion(node, state, sdfg, body)


@autoregister_params(op="Conv", name="dcnb")
class ConvBackward(BackwardImplementation):
    # gap: DaCe's only Conv backward calls ATen's CUDA depthwise kernel (at::thnn_conv_depthwise2d_backward_out),
    # which does not compile on CPU: every network with a convolution failed to build its backward
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return _conv_applies(node, in_desc_with_name(node, state, sdfg, "X"))

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        x, w = _in(forward_node, context, "X"), _in(forward_node, context, "W")
        y = _out(forward_node, context, "Y")
        wanted = [n for n in ("X", "W", "B") if n in required_gradients]
        body = "".join(_zero(f"{n}_grad", _in(forward_node, context, n)) for n in wanted)
        per_output = f"const auto dy = {_at('Y_grad', y, ['b', 'm', 'oh', 'ow'])};\n"
        per_output += "B_grad[m] += dy;\n" if "B" in wanted else ""
        inner = ""
        if "W" in wanted:
            inner += f"{_at('W_grad', w, ['m', 'c', 'kh', 'kw'])} += dy * {_at('X', x, ['b', 'ci', 'h', 'w_'])};\n"
        if "X" in wanted:
            inner += f"{_at('X_grad', x, ['b', 'ci', 'h', 'w_'])} += dy * {_at('W', w, ['m', 'c', 'kh', 'kw'])};\n"
        body += _conv_loops(forward_node, x, w, y, per_output, inner)
        reads = [n for n in ("X", "W") if {"X": "W", "W": "X"}[n] in wanted]
        return _cpp_backward(forward_node, context, ["Y_grad", *reads, *(f"{n}_grad" for n in wanted)], body)


_default_backward("Conv")


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
        x, y = _in(forward_node, context, "X"), _out(forward_node, context, "Y")
        kernel, strides, pads = _pool_window(forward_node, x)
        head, tail = _loops(["b", "c", "oh", "ow"], y.shape)
        body = (
            _zero("X_grad", x)
            + head
            + "long long best = -1; double top = 0;\n"
            + f"for (long long kh = 0; kh < {kernel[0]}; ++kh) for (long long kw = 0; kw < {kernel[1]}; ++kw) {{\n"
            + f"const long long h = oh * {strides[0]} - {pads[0]} + kh, w = ow * {strides[1]} - {pads[1]} + kw;\n"
            + f"if (h < 0 || h >= {x.shape[2]} || w < 0 || w >= {x.shape[3]}) continue;\n"
            + f"const long long xi = {_offset(x, ['b', 'c', 'h', 'w'])};\n"
            # the element PyTorch picks: the first maximum in the window, or its last NaN
            + "if (best < 0 || X[xi] > top || X[xi] != X[xi]) { best = xi; top = X[xi]; }\n"
            + "}\n"
            + f"if (best >= 0) X_grad[best] += {_at('Y_grad', y, ['b', 'c', 'oh', 'ow'])};\n"
            + tail
        )
        return _cpp_backward(forward_node, context, ["X", "Y_grad", "X_grad"], body)


_default_backward("MaxPool")


def _broadcast_index(desc: dt.Data, out_shape: list, out_index: list[str]) -> list[str]:
    """The index into ``desc`` that numpy-style broadcasting reads for output element ``out_index``."""
    if isinstance(desc, dt.Scalar):
        return []
    offset = len(out_shape) - len(desc.shape)
    return ["0" if int(size) == 1 else out_index[offset + i] for i, size in enumerate(desc.shape)]


@autoregister_params(op="Where", name="dcnb")
class WhereBackward(BackwardImplementation):
    # gap: DaCe's Where backward assumes X, Y and the condition have the output's shape; masked_fill with a
    # scalar (causal attention's -inf) broadcasts, and its backward failed to parse (incompatible subsets)
    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        cond, out = _in(forward_node, context, "condition"), _out(forward_node, context, "output")
        wanted = [n for n in ("X", "Y") if n in required_gradients]
        index = [f"i{k}" for k in range(len(out.shape))]
        head, tail = _loops(index, out.shape)
        body = "".join(_zero(f"{n}_grad", _in(forward_node, context, n)) for n in wanted)
        body += head + f"const bool take = {_at('condition', cond, _broadcast_index(cond, out.shape, index))};\n"
        body += f"const auto dy = {_at('output_grad', out, index)};\n"
        for n, when in (("X", "take"), ("Y", "!take")):
            if n in wanted:
                desc = _in(forward_node, context, n)
                body += f"if ({when}) {_at(f'{n}_grad', desc, _broadcast_index(desc, out.shape, index))} += dy;\n"
        body += tail
        return _cpp_backward(
            forward_node, context, ["condition", "output_grad", *(f"{n}_grad" for n in wanted)], body
        )


_default_backward("Where")


def _sce_applies(node, state, sdfg) -> bool:
    return node.reduction in ("mean", "sum", "none") and all(
        _contiguous(in_desc_with_name(node, state, sdfg, n)) for n in ("scores", "labels")
    )


def _sce_loops(node, scores: dt.Data, per_sample: str) -> str:
    """C++ visiting every sample of a SoftmaxCrossEntropyLoss: ``per_sample`` sees its index ``s``, its scores at
    ``scores[base + c * rest]``, ``label``, ``w`` (its weight, 0 if its label is ignored), ``lse`` (the log of
    the sum of exponentials of its scores), and ``total``, the weight a "mean" reduction divides by."""
    n, classes = scores.shape[0], scores.shape[1]
    rest = int(math.prod(int(size) for size in scores.shape[2:]))
    ignored = f"label == {node.ignore_index}" if node.ignore_index is not None else "false"
    weight = "(double)weights[label]" if "weights" in node.in_connectors else "1.0"
    samples = f"for (long long s = 0; s < {n * rest}; ++s) {{\nconst long long label = labels[s];\n"
    return (
        f"const long long rest = {rest};\ndouble total = 0;\n"
        + samples
        + f"if (!({ignored})) total += {weight};\n}}\n"
        + samples
        + f"const long long base = (s / rest) * {classes} * rest + s % rest;\n"
        + f"const double w = ({ignored}) ? 0.0 : {weight};\n"
        + "double top = scores[base];\n"
        + f"for (long long c = 1; c < {classes}; ++c) top = std::max(top, (double)scores[base + c * rest]);\n"
        + "double sum = 0;\n"
        + f"for (long long c = 0; c < {classes}; ++c) sum += std::exp(scores[base + c * rest] - top);\n"
        + "const double lse = top + std::log(sum);\n"
        + per_sample
        + "}\n"
    )


@_pure_expansion("SoftmaxCrossEntropyLoss", name="dcnb")
class SoftmaxCrossEntropyLossExpansion(ONNXForward):
    # gap: DaCe's pure SoftmaxCrossEntropyLoss reads the label scores as ``scores[:, labels]``, an N x N block
    # rather than one score per sample, so log_softmax + nll_loss (cross_entropy) gave a wrong loss
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return _sce_applies(node, state, sdfg)

    @staticmethod
    def forward(node, state, sdfg):
        scores = in_desc_with_name(node, state, sdfg, "scores")
        classes = scores.shape[1]
        per_sample = "const double loss = w == 0.0 ? 0.0 : -w * ((double)scores[base + label * rest] - lse);\n"
        if "log_prob" in node.out_connectors:
            per_sample += f"for (long long c = 0; c < {classes}; ++c) log_prob[base + c * rest] = scores[base + c * rest] - lse;\n"
        if node.reduction == "none":
            body = _sce_loops(node, scores, per_sample + "output[s] = loss;\n")
        else:
            body = "double acc = 0;\n" + _sce_loops(node, scores, per_sample + "acc += loss;\n")
            body += f"output[0] = acc{' / total' if node.reduction == 'mean' else ''};\n"
        return _cpp_expansion(node, state, sdfg, body)


@autoregister_params(op="SoftmaxCrossEntropyLoss", name="dcnb")
class SoftmaxCrossEntropyLossBackward(BackwardImplementation):
    # gap: DaCe has no backward for SoftmaxCrossEntropyLoss (log_softmax + nll_loss, cross_entropy): autodiff
    # failed on the label lookup of its expansion ("Failed at node indirection")
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return _sce_applies(node, state, sdfg)

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        scores = _in(forward_node, context, "scores")
        classes = scores.shape[1]
        given = [g for g in ("output", "log_prob") if g in given_gradients]
        per_sample = ""
        if "output" in given:
            scale = {"none": "output_grad[s]", "sum": "output_grad[0]", "mean": "output_grad[0] / total"}
            per_sample += f"const double up = w * {scale[forward_node.reduction]};\n"
        if "log_prob" in given:
            per_sample += f"double lp = 0;\nfor (long long c = 0; c < {classes}; ++c) lp += log_prob_grad[base + c * rest];\n"
        per_sample += (
            f"for (long long c = 0; c < {classes}; ++c) {{\n"
            + "const double p = std::exp(scores[base + c * rest] - lse);\ndouble g = 0;\n"
            + ("g += up * (p - (c == label ? 1.0 : 0.0));\n" if "output" in given else "")
            + ("g += log_prob_grad[base + c * rest] - p * lp;\n" if "log_prob" in given else "")
            + "scores_grad[base + c * rest] = g;\n}\n"
        )
        names = ["scores", "labels", *(["weights"] if "weights" in forward_node.in_connectors else [])]
        names += [f"{g}_grad" for g in given] + ["scores_grad"]
        return _cpp_backward(forward_node, context, names, _sce_loops(forward_node, scores, per_sample))


_default_backward("SoftmaxCrossEntropyLoss")


# --- before autodiff ------------------------------------------------------------------------------------------


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


# --- after autodiff -------------------------------------------------------------------------------------------


def accumulate_nested_gradients(sdfg: dace.SDFG) -> int:
    """Make gradients written by nested SDFGs and library nodes add up; returns how many writes were rerouted.

    gap: autodiff sums the gradients of an array used twice with a write-conflict resolution on each edge into
    it, but a nested SDFG (what backward rules such as LayerNormalization's return) writes through a pointer and
    ignores it: ``x + LayerNorm(x)`` got only LayerNorm's share of x's gradient. Each such write now goes to a
    zeroed temporary that a map adds into the gradient.
    """
    rerouted = 0
    for state in sdfg.states():
        for node in [n for n in state.nodes() if isinstance(n, (nodes.NestedSDFG, nodes.LibraryNode))]:
            for edge in list(state.out_edges(node)):
                if edge.data.wcr is None or not isinstance(edge.dst, nodes.AccessNode) or state.entry_node(node):
                    continue
                target, subset = edge.data.data, edge.data.subset
                sizes = subset.size()
                dtype = sdfg.arrays[target].dtype
                tmp, _ = sdfg.add_transient(f"{target}_part", sizes, dtype, find_new_name=True)
                tmp_node = state.add_access(tmp)
                tmp_node.setzero = True  # a rule may write only part of it (or add into it)
                state.add_edge(node, edge.src_conn, tmp_node, None, dace.Memlet.from_array(tmp, sdfg.arrays[tmp]))
                params = [f"__a{i}" for i in range(len(sizes))]
                begins = [r[0] for r in subset.ndrange()]
                steps = [r[2] for r in subset.ndrange()]
                state.add_mapped_tasklet(
                    f"accumulate_{target}",
                    {p: f"0:{s}" for p, s in zip(params, sizes)},
                    {"__in": dace.Memlet(f"{tmp}[{', '.join(params)}]")},
                    "__out = __in",
                    {
                        "__out": dace.Memlet(
                            f"{target}[{', '.join(f'{b} + ({st}) * {p}' for b, st, p in zip(begins, steps, params))}]",
                            wcr="lambda x, y: x + y",
                        )
                    },
                    external_edges=True,
                    input_nodes={tmp: tmp_node},
                    output_nodes={target: edge.dst},
                )
                state.remove_edge(edge)
                rerouted += 1
    return rerouted


def _rewrite_python_tasklets(sdfg: dace.SDFG, transformer: type[ast.NodeTransformer], wanted) -> int:
    """Rewrite the code of every Python tasklet with a node ``wanted`` matches; returns how many changed.

    ``transformer`` is made with the tasklet's float type, so that the constants it writes keep the code in that
    type: a double in a float expression does not compile once the expression is vectorized.
    """
    changed = 0
    for node, state in sdfg.all_nodes_recursive():
        if not isinstance(node, nodes.Tasklet) or node.code.language != dace.Language.Python:
            continue
        tree = ast.parse(node.code.as_string)
        if not any(wanted(n) for n in ast.walk(tree)):
            continue
        dtype = next(
            (state.sdfg.arrays[e.data.data].dtype for e in state.out_edges(node) if e.data.data is not None),
            dace.float64,
        )
        node.code = CodeBlock(ast.unparse(transformer(dtype).visit(tree)), dace.Language.Python)
        changed += 1
    return changed


def _typed(value: float, dtype) -> ast.expr:
    """``dace.float32(value)``: a constant of the tasklet's type, as DaCe's autodiff writes its constants."""
    return ast.Call(ast.Attribute(ast.Name("dace", ast.Load()), dtype.to_string(), ast.Load()), [ast.Constant(value)], [])


def _is_pi(node: ast.AST) -> bool:
    """``pi``, ``math.pi`` or ``dace.math.pi``, as sympy's printer and DaCe's cleaner write it."""
    if isinstance(node, ast.Name):
        return node.id == "pi"
    return isinstance(node, ast.Attribute) and node.attr == "pi" and isinstance(node.ctx, ast.Load)


class _NumericPi(ast.NodeTransformer):
    def __init__(self, dtype):
        self.dtype = dtype

    def visit(self, node: ast.AST) -> ast.AST:
        if _is_pi(node):
            return ast.copy_location(_typed(math.pi, self.dtype), node)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "sqrt" and len(node.args) == 1:
            if _is_pi(node.args[0]):  # a constant: no call left whose overload could depend on the type
                return ast.copy_location(_typed(math.sqrt(math.pi), self.dtype), node)
        return self.generic_visit(node)


def numeric_pi(sdfg: dace.SDFG) -> int:
    """Write the constant pi as a number in generated derivatives; returns how many tasklets changed.

    gap: the derivative of erf (GELU) is ``2*exp(-x**2)/sqrt(pi)``, which becomes C++ ``sqrt(dace::math::pi)``:
    pi is a typeless constant that converts to every float type, so the call is ambiguous and does not compile.
    """
    return _rewrite_python_tasklets(sdfg, _NumericPi, _is_pi)


def _is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _is_sympy_min_max(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("Min", "Max")


class _FloatMinMax(ast.NodeTransformer):
    def __init__(self, dtype):
        self.dtype = dtype

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if not _is_sympy_min_max(node):
            return node
        args = [_typed(float(a.value), self.dtype) if _is_int(a) else a for a in node.args]
        name = node.func.id.lower()
        result = args[-1]
        for arg in reversed(args[:-1]):  # binary calls, the ones every type (vectors too) has
            result = ast.Call(ast.Name(name, ast.Load()), [arg, result], [])
        return ast.copy_location(result, node)


def float_min_max(sdfg: dace.SDFG) -> int:
    """Write sympy's ``Min``/``Max`` in derivatives as binary ``min``/``max`` of the tasklet's float type;
    returns how many tasklets changed.

    gap: sympy writes ``Min(1, x)`` with the constant first, and DaCe's C++ ``Min`` returns its first argument's
    type, so ``Min(1, 0.58)`` is 0: the derivative of hardsigmoid (and of any clamp) was 0 everywhere. (``Min``
    also has no overload for vectors, so such a derivative could not be vectorized.)
    """
    return _rewrite_python_tasklets(sdfg, _FloatMinMax, _is_sympy_min_max)



def _is_float(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is float


def _is_typed(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "dace"
    )


class _TypedFloats(ast.NodeTransformer):
    def __init__(self, dtype):
        self.dtype = dtype

    def visit_Call(self, node: ast.Call) -> ast.AST:
        return node if _is_typed(node) else self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.copy_location(_typed(node.value, self.dtype), node) if _is_float(node) else node


def typed_float_literals(sdfg: dace.SDFG) -> int:
    """Give the float literals of Python tasklets the tasklet's type; returns how many tasklets changed.

    gap: DaCe writes the constants of its own expansions as bare literals (a mean's ``x * 0.0555``), which are
    doubles in C++: once vectorization makes ``x`` a vector of floats, a double times it does not compile
    ("conversion of scalar 'double' to vector ... involves truncation").
    """
    return _rewrite_python_tasklets(sdfg, _TypedFloats, _is_float)


# --- after auto_optimize --------------------------------------------------------------------------------------


def zeroed_transients_per_call(sdfg: dace.SDFG) -> int:
    """Give transients that must start at zero a lifetime of one call again; returns how many changed.

    gap: DaCe's auto_optimize makes transients persistent (allocated once per loaded binary), but an access node's
    ``setzero`` zeroes an array where it is allocated: autodiff's zero-initialized gradient accumulators then kept
    the previous call's sums, and gradients grew with every training step.
    """
    changed = set()
    for node, state in sdfg.all_nodes_recursive():
        if isinstance(node, nodes.AccessNode) and node.setzero:
            desc = state.sdfg.arrays[node.data]
            if desc.transient and desc.lifetime == dace.AllocationLifetime.Persistent:
                desc.lifetime = dace.AllocationLifetime.Scope
                changed.add((id(state.sdfg), node.data))
    return len(changed)


# --- before CUDA code generation ------------------------------------------------------------------------------


def accumulating_copies_to_maps(sdfg: dace.SDFG) -> int:
    """Turn copies that add into an array (outside maps) into maps that add element by element; returns how many.

    gap: DaCe's CUDA code generator emits no copy that adds into GPU memory ("Accumulate Device to Device not
    implemented"), and autodiff adds a gradient's contributions with such copies (MLP and attention backward).
    """
    turned = 0
    for state in (s for g in sdfg.all_sdfgs_recursive() for s in g.states()):
        for edge in list(state.edges()):
            src, dst, memlet = edge.src, edge.dst, edge.data
            if not (isinstance(src, nodes.AccessNode) and isinstance(dst, nodes.AccessNode)) or memlet.wcr is None:
                continue
            if state.entry_node(src) is not None:
                continue
            arrays = state.sdfg.arrays
            # the memlet's subset is its data's side of the copy; the other side, where not given, is a whole array
            ours, other = memlet.subset, memlet.other_subset
            dst_subset, src_subset = (ours, other) if memlet.data == dst.data else (other, ours)
            dst_subset = dst_subset or dace.subsets.Range.from_array(arrays[dst.data])
            src_subset = src_subset or dace.subsets.Range.from_array(arrays[src.data])
            sizes = [s for s in dst_subset.size() if s != 1]
            if [s for s in src_subset.size() if s != 1] != sizes:
                continue  # a reshaping copy: left to DaCe
            params = [f"__c{i}" for i in range(len(sizes))]
            state.add_mapped_tasklet(
                f"accumulate_{dst.data}",
                {p: f"0:{s}" for p, s in zip(params, sizes)} or {"__c": "0:1"},
                {"__in": dace.Memlet(f"{src.data}[{_moved_index(src_subset, params)}]")},
                "__out = __in",
                {"__out": dace.Memlet(f"{dst.data}[{_moved_index(dst_subset, params)}]", wcr=memlet.wcr)},
                external_edges=True,
                input_nodes={src.data: src},
                output_nodes={dst.data: dst},
            )
            state.remove_edge(edge)
            turned += 1
    return turned


def _moved_index(subset: dace.subsets.Range, params: list[str]) -> str:
    """An element of ``subset`` as an index: its dimensions longer than one moved by ``params``, in order."""
    moving = iter(params)
    return ", ".join(
        str(begin) if size == 1 else f"{begin} + ({step}) * {next(moving)}"
        for (begin, _, step), size in zip(subset.ndrange(), subset.size())
    )
