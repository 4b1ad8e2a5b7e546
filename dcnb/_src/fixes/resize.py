"""Resize (F.interpolate, nn.Upsample): nearest, (multi)linear and (bi)cubic, expansion and backward, as C++ loops."""

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
        node.mode in ("nearest", "linear", "cubic")
        and (node.mode != "cubic" or not node.exclude_outside)
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


def _cubic(node, d: int, n) -> str:
    """C++ for dimension ``d``'s four taps around input coordinate ``x{d}`` (Keys' cubic convolution with
    coefficient ``a``, as PyTorch's bicubic: the coordinate not clamped, taps beyond the edges read the edge)."""
    a = float(node.cubic_coeff_a)
    near = "(({a} + 2) * {t} - ({a} + 3)) * {t} * {t} + 1"  # |distance| <= 1
    far = "(({a} * {t} - 5 * {a}) * {t} + 8 * {a}) * {t} - 4 * {a}"  # 1 < |distance| < 2
    weights = [far.format(a=a, t=f"(t{d} + 1)"), near.format(a=a, t=f"t{d}"), near.format(a=a, t=f"(1 - t{d})"),
               far.format(a=a, t=f"(2 - t{d})")]
    taps = ", ".join(f"std::min(std::max(b{d} + ({k}), 0LL), {n} - 1LL)" for k in (-1, 0, 1, 2))
    return (
        f"const long long b{d} = (long long)floor(x{d});\n"
        f"const double t{d} = x{d} - b{d};\n"
        f"const double cw{d}[4] = {{{', '.join(weights)}}};\n"
        f"const long long cs{d}[4] = {{{taps}}};\n"
    )


def _taps(node, scales: list[float], x: dt.Data, y: dt.Data, use: str) -> str:
    """C++ visiting every output element ``o0..`` and the input elements ``s0..`` it is interpolated from, each
    with its weight ``weight``, as seen by ``use``."""
    index = [f"o{d}" for d in range(len(y.shape))]
    head, tail = loops(index, y.shape)
    prelude, corner, weight, taps = "", "", [], 1
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
        if node.mode == "cubic":
            prelude, count = prelude + _cubic(node, d, n), 4
        else:  # as PyTorch: the coordinate clamped at 0, the element below it and the next one (the last one twice)
            prelude += (
                f"const double c{d} = x{d} > 0 ? x{d} : 0.0;\n"
                f"const long long l{d} = std::min((long long)c{d}, {n} - 1LL);\n"
                f"const double w{d} = c{d} - l{d};\n"
                f"const double cw{d}[2] = {{1.0 - w{d}, w{d}}};\n"
                f"const long long cs{d}[2] = {{l{d}, std::min(l{d} + 1, {n} - 1LL)}};\n"
            )
            count = 2
        corner += f"const int k{d} = (corner / {taps}) % {count};\nconst long long s{d} = cs{d}[k{d}];\n"
        weight.append(f"cw{d}[k{d}]")
        taps *= count
    corner += f"const double weight = {' * '.join(weight) or '1.0'};\n"
    return head + prelude + f"for (int corner = 0; corner < {taps}; ++corner) {{\n" + corner + use + "}\n" + tail


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
