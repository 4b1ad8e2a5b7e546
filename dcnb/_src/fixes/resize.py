"""Resize (F.interpolate, nn.Upsample): nearest and (multi)linear, expansion and backward, as C++ loops."""

from __future__ import annotations

from dace import data as dt
from dace.autodiff.base_abc import BackwardImplementation
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.registry import autoregister_params
from dace.sdfg.utils import in_desc_with_name, out_desc_with_name

from .array_ops import constant_input
from .cpp import at, cpp_backward, cpp_expansion, forward_in, forward_out, loops, zero
from .registry import default_backward, pure_expansion

#: C++ for the input coordinate of output coordinate ``o`` (double), per coordinate_transformation_mode: ``scale``
#: is output over input size, ``n`` and ``m`` the input's and the output's size
_COORDINATES = {
    "half_pixel": "({o} + 0.5) / {scale!r} - 0.5",
    "pytorch_half_pixel": "{m} > 1 ? ({o} + 0.5) / {scale!r} - 0.5 : 0.0",
    "align_corners": "{m} > 1 ? (double){o} * ({n} - 1) / ({m} - 1) : 0.0",
    "asymmetric": "{o} / {scale!r}",
}
#: C++ rounding an input coordinate ``x`` to the nearest element, per nearest_mode
_NEAREST = {
    "floor": "floor({x})",
    "ceil": "ceil({x})",
    "round_prefer_floor": "ceil({x} - 0.5)",
    "round_prefer_ceil": "floor({x} + 0.5)",
}


def _applies(node, state, sdfg) -> bool:
    return (
        node.mode in ("nearest", "linear")
        and node.coordinate_transformation_mode in _COORDINATES
        and (node.mode != "nearest" or node.nearest_mode in _NEAREST)
        and not node.antialias
        and not node.axes
        and node.keep_aspect_ratio_policy == "stretch"
        and _scales(node, state, sdfg) is not None
    )


def _scales(node, state, sdfg) -> list[float] | None:
    """Output over input size per dimension: the constant scales, else the sizes' ratio (as ONNX computes it)."""
    x, y = in_desc_with_name(node, state, sdfg, "X"), out_desc_with_name(node, state, sdfg, "Y")
    scales = constant_input(node, state, sdfg, "scales") if "scales" in node.in_connectors else []
    if scales is None:
        return None
    return [float(s) for s in scales] or [int(m) / int(n) for n, m in zip(x.shape, y.shape)]


def _taps(node, scales: list[float], x: dt.Data, y: dt.Data, use: str) -> str:
    """C++ visiting every output element ``o0..`` and the input elements ``s0..`` it is interpolated from, each
    with its weight ``weight``, as seen by ``use``."""
    index = [f"o{d}" for d in range(len(y.shape))]
    head, tail = loops(index, y.shape)
    prelude, corner, weight, taps = "", "", [], 0
    for d, (o, n, m, scale) in enumerate(zip(index, x.shape, y.shape, scales)):
        if int(n) == int(m) and scale == 1.0:  # not resized: the same element
            corner += f"const long long s{d} = {o};\n"
            continue
        coordinate = _COORDINATES[node.coordinate_transformation_mode].format(o=o, n=n, m=m, scale=scale)
        prelude += f"const double x{d} = {coordinate};\n"
        if node.mode == "nearest":
            rounded = _NEAREST[node.nearest_mode].format(x=f"x{d}")
            prelude += f"const long long l{d} = std::min(std::max((long long){rounded}, 0LL), {n} - 1LL);\n"
            corner += f"const long long s{d} = l{d};\n"
            continue
        # as PyTorch: the coordinate clamped at 0, the element below it and the next one (the last one twice)
        prelude += (
            f"const double c{d} = x{d} > 0 ? x{d} : 0.0;\n"
            f"const long long l{d} = std::min((long long)c{d}, {n} - 1LL);\n"
            f"const long long h{d} = std::min(l{d} + 1, {n} - 1LL);\n"
            f"const double w{d} = c{d} - l{d};\n"
        )
        corner += f"const bool up{d} = (corner >> {taps}) & 1;\nconst long long s{d} = up{d} ? h{d} : l{d};\n"
        weight.append(f"(up{d} ? w{d} : 1.0 - w{d})")
        taps += 1
    corner += f"const double weight = {' * '.join(weight) or '1.0'};\n"
    return head + prelude + f"for (int corner = 0; corner < {1 << taps}; ++corner) {{\n" + corner + use + "}\n" + tail


@pure_expansion("Resize", name="dcnb")
class ResizeExpansion(ONNXForward):
    # gap: DaCe's Resize is a C++ tasklet autodiff cannot differentiate (F.interpolate failed to build its backward)
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return _applies(node, state, sdfg)

    @staticmethod
    def forward(node, state, sdfg):
        x, y = in_desc_with_name(node, state, sdfg, "X"), out_desc_with_name(node, state, sdfg, "Y")
        y_at = at("Y", y, [f"o{d}" for d in range(len(y.shape))])
        use = f"{y_at} += weight * {at('X', x, [f's{d}' for d in range(len(x.shape))])};\n"
        body = zero("Y", y) + _taps(node, _scales(node, state, sdfg), x, y, use)
        return cpp_expansion(node, state, sdfg, body)


@autoregister_params(op="Resize", name="dcnb")
class ResizeBackward(BackwardImplementation):
    # gap: DaCe has no backward for Resize: each output's gradient goes back to the elements it was interpolated from
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return _applies(node, state, sdfg)

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        x, y = forward_in(forward_node, context, "X"), forward_out(forward_node, context, "Y")
        scales = _scales(forward_node, context.forward_state, context.forward_sdfg)
        dy = at("Y_grad", y, [f"o{d}" for d in range(len(y.shape))])
        use = f"{at('X_grad', x, [f's{d}' for d in range(len(x.shape))])} += weight * {dy};\n"
        body = zero("X_grad", x) + _taps(forward_node, scales, x, y, use)
        return cpp_backward(forward_node, context, ["Y_grad", "X_grad"], body)


default_backward("Resize")
