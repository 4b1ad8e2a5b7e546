"""Normalization ops: BatchNormalization over any rank, in training and eval mode (and in training mode with the
activation after it, ``BatchNormActivation``), InstanceNormalization (nn.InstanceNorm, GroupNorm's export),
LpNormalization, and Softmax and LogSoftmax over any one axis."""

from __future__ import annotations

import math
from collections.abc import Callable

import dace
import numpy as np
from dace import data as dt
from dace.autodiff.base_abc import BackwardImplementation
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.libraries.onnx.nodes.onnx_op_registry import get_onnx_node
from dace.properties import ListProperty, Property
from dace.registry import autoregister_params
from dace.sdfg import nodes
from dace.sdfg.utils import in_desc_with_name, out_desc_with_name
from dace.transformation.transformation import ExpandTransformation

from .cpp import (
    channels_last,
    chunk_total,
    cpp_backward,
    cpp_expansion,
    forward_in,
    forward_out,
    loops,
    offset,
    parallel_for,
    row_chunks,
    simd,
)
from .programs import parsed
from .registry import default_backward, pure_expansion


@pure_expansion("BatchNormalization", name="dcnb")
class BatchNormalizationExpansion(ONNXForward):
    # gap: DaCe's pure BatchNormalization in training mode keeps 10% of the old running statistics where ONNX's
    # momentum (0.9 for PyTorch's 0.1) keeps 90%, and copies them back through a second state, which autodiff
    # (one state only) cannot take; in either mode it covers only 4-D inputs (not BatchNorm1d's (N, C), (N, C, L))
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        inputs = {"scale", "B", "input_mean", "input_var"}
        return len(in_desc_with_name(node, state, sdfg, "X").shape) >= 2 and inputs <= set(node.in_connectors)

    @staticmethod
    def forward(node, state, sdfg):
        if not node.training_mode:
            return _batch_normalization_eval(node, state, sdfg)
        return _batch_normalization_training(node, state, sdfg)


def _batch_normalization_training(node, state, sdfg, activation: str | None = None, bounds=()) -> dace.SDFG:
    """Training mode: the batch's statistics normalize (one pass summing, one writing Y, through ``activation``
    where there is one: a key of ``ACTIVATIONS``, with its ``bounds``, after adding the input ``R`` where the node
    has one), and the running statistics are updated."""
    x, y = in_desc_with_name(node, state, sdfg, "X"), out_desc_with_name(node, state, sdfg, "Y")
    added = "R" in node.in_connectors
    channel = _Channel(x, y, in_desc_with_name(node, state, sdfg, "R") if added else None)
    # PyTorch, whose BatchNorm the exporter writes here, keeps the unbiased variance as its running estimate
    keep, take = float(node.momentum), 1 - float(node.momentum)
    take_unbiased = take * channel.count / max(channel.count - 1, 1)
    channel.statistics(float(node.epsilon))
    channel.scalars("const double k = scale[_c] * inv_std, b = B[_c] - mean * k;\n")
    written = ACTIVATIONS[activation][0]("_v", list(bounds)) if activation else "_v"
    channel.each(f"const double _v = X[_i] * k + b{' + R[_a]' if added else ''}; Y[_o] = {written};", ("k", "b"))
    if {"running_mean", "running_var"} <= set(node.out_connectors):
        channel.scalars(
            f"running_mean[_c] = input_mean[_c] * {keep!r} + mean * {take!r};\n"
            f"running_var[_c] = input_var[_c] * {keep!r} + var * {take_unbiased!r};\n"
        )
    return cpp_expansion(node, state, sdfg, channel.code())


def _batch_normalization_eval(node, state, sdfg) -> dace.SDFG:
    """Eval mode: the running statistics normalize, scaled and shifted per channel; nothing is updated. A program
    of maps, which the steps can fuse with the maps around it."""
    x = in_desc_with_name(node, state, sdfg, "X")
    scalar = x.dtype.type
    eps, one = scalar(node.epsilon), scalar(1)
    per_channel = [x.shape[1]] + [1] * (len(x.shape) - 2)

    def prog(X, scale, B, input_mean, input_var, Y):
        factor = dace.elementwise(lambda v: one / sqrt(v + eps), input_var) * scale
        Y[:] = (X - np.reshape(input_mean, per_channel)) * np.reshape(factor, per_channel) + np.reshape(
            B, per_channel
        )

    return parsed(prog, sdfg, state, node)


@autoregister_params(op="BatchNormalization", name="dcnb")
class BatchNormalizationBackward(BackwardImplementation):
    # gap: DaCe has no backward for BatchNormalization; differentiating a program of maps for it gave 15 passes
    # over the data (training mode, 8x64x112x112: 66 ms where PyTorch's backward takes about 10) reading what the
    # forward stored for them. Here one pass per channel sums what the gradients need (in training mode the batch's
    # statistics too, again: nothing is stored) and a second writes the input's gradient
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        # where nothing reads Y (the export folded what did: only the running statistics are used), the node is
        # expanded before autodiff, as simplify would take Y away from it and leave it invalid
        return BatchNormalizationExpansion.forward_can_be_applied(node, state, sdfg) and _read(state, node, "Y")

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        return _batch_norm_backward_node(forward_node, context, required_gradients, bool(forward_node.training_mode))


default_backward("BatchNormalization")

#: activations a training-mode BatchNormalization takes into its pass writing Y (``BatchNormActivation``), each as
#: C++ (its value of the normalized value ``v``; whether the gradient passes, from its output ``z``), given its
#: constant bounds, NaN kept as eager keeps it. Only those whose derivative their output gives: the backward reads
#: the output, which the op after keeps for its own backward anyway, not the value before, which nothing then stores
ACTIVATIONS: dict[str, tuple[Callable[[str, list[float]], str], Callable[[str, list[float]], str]]] = {
    # (the gradient's tests negated, as ATen writes them: a NaN passes it)
    "Relu": (lambda v, _: f"{v} < 0 ? 0.0 : {v}", lambda z, _: f"!({z} <= 0)"),
    # ReLU6's and hardtanh's Clip only (export_rules.HARDTANH): clamp's gradient passes at a bound, which the
    # output cannot tell from beyond it
    "Clip": (
        lambda v, b: f"{v} < {b[0]!r} ? {b[0]!r} : {v} > {b[1]!r} ? {b[1]!r} : {v}",
        lambda z, b: f"!({z} <= {b[0]!r} || {z} >= {b[1]!r})",
    ),
}


def _batch_norm_backward_node(forward_node, context, required_gradients, training: bool, activation=None, bounds=()):
    """The backward node of a BatchNormalization, or of a ``BatchNormActivation`` of ``activation``: there dY is
    Y's gradient where the activation's output (its Y) lets it pass, and 0 elsewhere, and the gradient of the input
    ``R`` it adds, where it has one, is dY."""
    added = "R" in forward_node.in_connectors
    x, y = forward_in(forward_node, context, "X"), forward_out(forward_node, context, "Y")
    channel = _Channel(x, y, forward_in(forward_node, context, "R") if added else None)
    wanted = [n for n in ("X", "scale", "B", "R") if n in required_gradients]
    reads = ["X", "scale"] + ([] if training else ["input_mean", "input_var"]) + (["Y"] if activation else [])
    names = ["Y_grad", *reads, *(f"{n}_grad" for n in wanted)]
    dy = "Y_grad[_o]"
    if activation:
        dy = f"({ACTIVATIONS[activation][1]('Y[_o]', list(bounds))} ? (double)Y_grad[_o] : 0.0)"
    body = _batch_norm_backward(channel, float(forward_node.epsilon), wanted, training, dy)
    return cpp_backward(forward_node, context, names, body)


@dace.library.expansion
class ExpandBatchNormActivation(ExpandTransformation):
    environments = []
    expansion = staticmethod(
        lambda node, state, sdfg: _batch_normalization_training(node, state, sdfg, node.activation, node.bounds)
    )


@dace.library.node
class BatchNormActivation(nodes.LibraryNode):
    """A training-mode BatchNormalization (ONNX's connectors, epsilon and momentum) whose Y, plus the input ``R``
    where it has that connector (a residual connection's), goes through ``activation`` (a key of ``ACTIVATIONS``,
    with its constant ``bounds``) before it is written: what the sum and the activation would have read and written
    again, and what the forward stored for the backward, is not there (``on_import.activations_into_norms``)."""

    implementations = {"dcnb": ExpandBatchNormActivation}
    default_implementation = "dcnb"

    epsilon = Property(dtype=float, default=1e-5)
    momentum = Property(dtype=float, default=0.9)
    activation = Property(dtype=str, default="Relu")
    bounds = ListProperty(element_type=float, default=[])

    def __init__(self, name, inputs=None, outputs=None, epsilon=1e-5, momentum=0.9, activation="Relu", bounds=()):
        super().__init__(name, inputs=inputs or set(), outputs=outputs or set())
        self.epsilon, self.momentum, self.activation, self.bounds = epsilon, momentum, activation, list(bounds)


@autoregister_params(node_type=BatchNormActivation, name="dcnb")
class BatchNormActivationBackward(BackwardImplementation):
    # BatchNormalization's backward, reading the gradient of its output where the activation's output lets it pass
    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        node = forward_node
        return _batch_norm_backward_node(node, context, required_gradients, True, node.activation, node.bounds)


def _read(state, node, connector: str) -> bool:
    """Whether what ``node`` writes through ``connector`` is an argument or read somewhere in its SDFG."""
    written = [e.data.data for e in state.out_edges(node) if e.src_conn == connector]
    sdfg = state.sdfg
    return any(
        not sdfg.arrays[name].transient
        or any(n.data == name and s.out_degree(n) for s in sdfg.states() for n in s.data_nodes())
        for name in written
    )


def _batch_norm_backward(channel: _Channel, eps: float, wanted: list[str], training: bool, dy: str) -> str:
    """C++ for the gradients ``wanted`` of a BatchNormalization, one channel's at a time as ``channel`` lays them
    out: with x_hat = (x - mean) * inv_std over its M elements, d scale = sum(dY * x_hat), dB = sum(dY), and dX =
    scale * inv_std * (dY - sum(dY) / M - x_hat * sum(dY * x_hat) / M) in training mode (the batch's statistics),
    scale * inv_std * dY in eval mode; ``dy`` is dY's element (C++ over ``[_o]``)."""
    if training:
        channel.statistics(eps, dy=dy)
    else:
        channel.scalars(
            f"const double mean = input_mean[_c], inv_std = 1.0 / sqrt((double)input_var[_c] + {eps!r});\n"
        )
        if "scale" in wanted or "B" in wanted:
            terms = f"const double dy = {dy}; s_dy += dy; s_dyx += dy * (X[_i] - mean);"
            channel.sum(("s_dy", "s_dyx"), terms, ("mean",))
        else:
            channel.scalars("double s_dy = 0, s_dyx = 0;\n")
    channel.scalars("const double sum_dy_x_hat = inv_std * s_dyx;\n")
    if "scale" in wanted:
        channel.scalars("scale_grad[_c] = sum_dy_x_hat;\n")
    if "B" in wanted:
        channel.scalars("B_grad[_c] = s_dy;\n")
    # R's gradient is dY, written in the pass writing X's (where there is one) from the value read once there: after
    # the store into X_grad, which may alias Y_grad for the compiler, it would be read again
    head, r_grad = "", ""
    if "R" in wanted:
        head, r_grad, dy = f"const double _dy = {dy}; ", " R_grad[_a] = _dy;", "_dy"
    if "X" in wanted and training:
        channel.scalars(
            f"const double k = scale[_c] * inv_std, shift = s_dy / {channel.count}, "
            f"slope = sum_dy_x_hat * inv_std / {channel.count};\n"
        )
        code = f"X_grad[_i] = k * ({dy} - shift - (X[_i] - mean) * slope);"
        channel.each(head + code + r_grad, ("k", "shift", "mean", "slope"))
    elif "X" in wanted:
        channel.scalars("const double k = scale[_c] * inv_std;\n")
        channel.each(head + f"X_grad[_i] = k * {dy};" + r_grad, ("k",))
    elif r_grad:
        channel.each(head + r_grad, ())
    return channel.code()


def _dense_image(desc: dt.Data) -> bool:
    """Whether an (N, C, spatial...) array's images are each one run of elements, its last axis's stride apart."""
    shape, strides = [int(n) for n in desc.shape], [int(n) for n in desc.strides]
    return all(strides[d] == strides[-1] * math.prod(shape[d + 1 :]) for d in range(2, len(shape)))


class _Channel:
    """C++ over the channels of a BatchNormalization's input ``x`` (N, C, spatial...), its output ``y`` and the
    input ``r`` added to it, where there is one: ``[_i]`` indexes an element of X (and of its gradient), ``[_o]`` of
    Y, ``[_a]`` of R (and of their gradients), in their own strides, ``_c`` is the channel. A channel's work is a
    sequence of parts, which ``code`` lays out: ``sum`` (a pass over its elements adding into doubles), ``scalars``
    (per-channel values and outputs), ``each`` (a pass writing each element). Over (N, C, H, W) arrays the channels
    are spread over the threads, each channel's parts in turn; over channels-last ones (NHWC) each pass reads the
    arrays once in memory order, rows of channels, a vector loop over the channels (a sum into partial sums per
    chunk of rows): a channel's elements are C apart there, and a pass per channel read every line C / 16 times."""

    def __init__(self, x: dt.Data, y: dt.Data, r: dt.Data | None = None):
        self.channels = int(x.shape[1])
        self.count = math.prod(int(s) for i, s in enumerate(x.shape) if i != 1)
        self._parts: list[tuple] = []
        spatial = [int(n) for n in x.shape[2:]]
        arrays = (x, y) if r is None else (x, y, r)
        self._last = all(channels_last(d) for d in arrays)
        if self._last:
            self._index = [f"(_r) * {self.channels} + (_c)"] * len(arrays)
        elif len(spatial) > 1 and all(_dense_image(d) for d in arrays):
            # one loop over an image's elements: 7x7 images (EfficientNet's last blocks) left loops of 7 to vectorize
            self._loops = loops(["_n", "_s"], [x.shape[0], math.prod(spatial)])
            at_s = "(_n) * {} + (_c) * {} + (_s) * {}"
            self._index = [at_s.format(d.strides[0], d.strides[1], d.strides[-1]) for d in arrays]
        else:
            others = ["_n"] + [f"_s{i}" for i in range(len(spatial))]
            self._loops = loops(others, [x.shape[0], *spatial])
            index = [others[0], "_c", *others[1:]]
            self._index = [offset(d, index) for d in arrays]
        # float32 terms summed in double may be summed raw (sum x, sum x * x) in one pass; float64 ones would
        # cancel in it, and take a second pass over the values centered
        self._one_pass = x.dtype != dace.float64

    def sum(self, sums: tuple[str, ...], terms: str, uses: tuple[str, ...] = ()) -> None:
        """Declare the doubles ``sums``, each the sum over the channel's elements of what ``terms`` adds into it;
        ``terms`` reads the channel's values ``uses``."""
        self._parts.append(("sum", sums, terms, uses))

    def scalars(self, code: str) -> None:
        """Per-channel ``code``: values later parts read, outputs indexed by ``_c``."""
        self._parts.append(("scalars", code))

    def each(self, code: str, uses: tuple[str, ...]) -> None:
        """``code`` for each element of the channel, reading the channel's values ``uses``."""
        self._parts.append(("each", code, uses))

    def statistics(self, eps: float, dy: str | None = None) -> None:
        """Declare the channel's ``mean``, ``var`` and ``inv_std``; with ``dy`` (Y's gradient's element, C++ over
        ``[_o]``), also ``s_dy`` (its sum) and ``s_dyx`` (of its products with X centered)."""
        n = self.count
        if self._one_pass:
            terms = "const double x = X[_i]; s_x += x; s_xx += x * x;"
            terms += f" const double dy = {dy}; s_dy += dy; s_dyx += dy * x;" if dy else ""
            self.sum(("s_x", "s_xx", "s_dy", "s_dyx") if dy else ("s_x", "s_xx"), terms)
            code = f"const double mean = s_x / {n}, raw = s_xx / {n} - mean * mean, var = raw > 0 ? raw : 0;\n"
            self.scalars(code + ("s_dyx -= mean * s_dy;\n" if dy else ""))
        else:
            self.sum(("s_x", "s_dy") if dy else ("s_x",), "s_x += X[_i];" + (f" s_dy += {dy};" if dy else ""))
            self.scalars(f"const double mean = s_x / {n};\n")
            second = "const double d = X[_i] - mean; s_xx += d * d;" + (f" s_dyx += {dy} * d;" if dy else "")
            self.sum(("s_xx", "s_dyx") if dy else ("s_xx",), second, ("mean",))
            self.scalars(f"const double var = s_xx / {n};\n")
        self.scalars(f"const double inv_std = 1.0 / sqrt(var + {eps!r});\n")

    def code(self) -> str:
        """The parts as C++, in the layout of the arrays."""
        return self._channels_last() if self._last else self._per_channel()

    def _elements(self, code: str) -> str:
        for placeholder, index in zip(("[_i]", "[_o]", "[_a]"), self._index):
            code = code.replace(placeholder, f"[{index}]")
        return code

    def _per_channel(self) -> str:
        body = ""
        head, tail = self._loops
        outer, innermost = head.rsplit("for (", 1)
        for kind, *part in self._parts:
            if kind == "scalars":
                body += part[0]
                continue
            # the innermost loop vectorized: without the pragma a sum into a double is a chain of dependent
            # additions, and the compiler vectorizes neither it nor the loop
            sums, code = (part[0], part[1]) if kind == "sum" else ((), part[0])
            body += "".join(f"double {s} = 0;\n" for s in sums)
            body += outer + simd(sums) + "for (" + innermost + self._elements(code) + "\n" + tail
        return parallel_for() + f"for (long long _c = 0; _c < {self.channels}; ++_c) {{\n{body}}}\n"

    def _channels_last(self) -> str:
        channels, rows = self.channels, self.count
        summed: list[str] = []  # the sums so far, one array of a value per channel each
        scalars = ""  # the per-channel code so far, run again wherever a channel's values are needed
        body, arrays = "", []

        def per_channel(after: str) -> str:
            load = "".join(f"double {s} = _sum_{s}[_c];\n" for s in summed)
            loop = f"for (long long _c = 0; _c < {channels}; ++_c) {{\n{load}{scalars}{after}}}\n"
            return parallel_for() + loop

        def values(uses: tuple[str, ...]) -> tuple[str, str]:
            """Per-channel code storing ``uses``, and the loads of them inside a pass."""
            for name in uses:
                if f"_use_{name}" not in arrays:
                    arrays.append(f"_use_{name}")
            store = "".join(f"_use_{n}[_c] = {n};\n" for n in uses)
            return (per_channel(store) if uses else ""), "".join(f"const double {n} = _use_{n}[_c];\n" for n in uses)

        for kind, *part in self._parts:
            if kind == "scalars":
                scalars += part[0]
                continue
            store, load = values(part[-1])
            body += store
            if kind == "each":
                body += parallel_for() + f"for (long long _r = 0; _r < {rows}; ++_r) {{\n" + simd()
                body += f"for (long long _c = 0; _c < {channels}; ++_c) {{\n{load}{self._elements(part[0])}\n}}\n}}\n"
                continue
            # row by row (the array once, in memory order), a vector loop over the channels adding into the partial
            # sums of the row's chunk; then each channel's chunks added in order
            sums, terms = part[0], part[1]
            arrays.extend(f"_sum_{s}" for s in sums)
            size = len(sums) * channels
            head, tail, chunks = row_chunks(rows, size)
            body += "{\n" + head + "".join(f"double* _part_{s} = _s + {k * channels};\n" for k, s in enumerate(sums))
            body += simd() + f"for (long long _c = 0; _c < {channels}; ++_c) {{\n{load}"
            body += "".join(f"double {s} = 0;\n" for s in sums) + self._elements(terms) + "\n"
            body += "".join(f"_part_{s}[_c] += {s};\n" for s in sums) + "}\n" + tail
            body += parallel_for() + f"for (long long _c = 0; _c < {channels}; ++_c) {{\n"
            for k, s in enumerate(sums):
                body += "{\n" + chunk_total("_t", chunks, size, f"{k * channels} + _c") + f"_sum_{s}[_c] = _t;\n}}\n"
            body += "}\ndelete[] _part;\n}\n"
            summed.extend(sums)
        body += per_channel("")  # the per-channel outputs
        allocated = "".join(f"double* {a} = new double[{channels}]();\n" for a in arrays)
        return "{\n" + allocated + body + "".join(f"delete[] {a};\n" for a in arrays) + "}\n"


@pure_expansion("InstanceNormalization")
class InstanceNormalizationExpansion(ONNXForward):
    # gap: DaCe has no implementation of the ONNX op InstanceNormalization (nn.InstanceNorm*, and nn.GroupNorm,
    # which PyTorch exports as it over groups)
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return len(in_desc_with_name(node, state, sdfg, "input").shape) >= 3

    @staticmethod
    def forward(node, state, sdfg):
        x = in_desc_with_name(node, state, sdfg, "input")
        axes = tuple(range(2, len(x.shape)))
        scalar = x.dtype.type
        eps, one = scalar(node.epsilon), scalar(1)
        inv_count = scalar(1 / math.prod(int(x.shape[a]) for a in axes))
        per_channel = [x.shape[1]] + [1] * (len(x.shape) - 2)

        def prog(input, scale, B, output):
            mean = np.add.reduce(input, axis=axes, keepdims=True) * inv_count
            centered = input - mean
            var = np.add.reduce(centered * centered, axis=axes, keepdims=True) * inv_count
            inv_std = dace.elementwise(lambda v: one / sqrt(v + eps), var)
            output[:] = centered * inv_std * np.reshape(scale, per_channel) + np.reshape(B, per_channel)

        return parsed(prog, sdfg, state, node)


def _register_softmax(op: str, log: bool) -> None:
    """``op`` over any one axis: DaCe's own expansion where that is the last (what fuse_rows takes apart), else the
    same program over the one axis."""
    dace_own = get_onnx_node(op).implementations["pure"].forward_impl

    class Expansion(ONNXForward):
        @staticmethod
        def forward(node, state, sdfg):
            rank = len(in_desc_with_name(node, state, sdfg, "input").shape)
            if node.axis % rank == rank - 1:
                return dace_own.forward(node, state, sdfg)
            axes = (node.axis % rank,)

            def softmax(input, output):
                shifted = input - np.maximum.reduce(input, axis=axes, keepdims=True)
                exponent = np.exp(shifted)
                output[:] = exponent / np.add.reduce(exponent, axis=axes, keepdims=True)

            def log_softmax(input, output):
                shifted = input - np.maximum.reduce(input, axis=axes, keepdims=True)
                output[:] = shifted - np.log(np.add.reduce(np.exp(shifted), axis=axes, keepdims=True))

            return parsed(log_softmax if log else softmax, sdfg, state, node)

    Expansion.__name__ = f"{op}Expansion"
    pure_expansion(op, name="dcnb")(Expansion)


# gap: DaCe's Softmax and LogSoftmax reduce over every axis from ``axis`` on, as ONNX's did before opset 13; since,
# over that axis alone: a softmax over channels (nn.Softmax2d, torch.softmax(x, 1)) was wrong
_register_softmax("Softmax", log=False)
_register_softmax("LogSoftmax", log=True)


@pure_expansion("LpNormalization")
class LpNormalizationExpansion(ONNXForward):
    # gap: DaCe has no implementation of the ONNX op LpNormalization (weight norm's and w / w.norm(dim=1,
    # keepdim=True) as PyTorch exports them)
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return node.p in (1, 2)

    @staticmethod
    def forward(node, state, sdfg):
        axes = (node.axis % len(in_desc_with_name(node, state, sdfg, "input").shape),)

        def l2(input, output):
            output[:] = input / np.sqrt(np.add.reduce(input * input, axis=axes, keepdims=True))

        def l1(input, output):  # |x| as max(x, -x): DaCe's autodiff fails on np.abs' ("no attribute 'expr'")
            output[:] = input / np.add.reduce(np.maximum(input, -input), axis=axes, keepdims=True)

        return parsed(l2 if node.p == 2 else l1, sdfg, state, node)
