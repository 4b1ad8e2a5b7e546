"""Normalization ops: BatchNormalization over any rank, in training and eval mode, InstanceNormalization
(nn.InstanceNorm, GroupNorm's export), LpNormalization, and Softmax and LogSoftmax over any one axis."""

from __future__ import annotations

import math

import dace
import numpy as np
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.libraries.onnx.nodes.onnx_op_registry import get_onnx_node
from dace.sdfg.utils import in_desc_with_name

from .programs import parsed
from .registry import pure_expansion


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

        return parsed(prog, sdfg, state, node, normalize=dace.program(normalize))


def _batch_normalization_eval(node, state, sdfg) -> dace.SDFG:
    """Eval mode: the running statistics normalize, scaled and shifted per channel; nothing is updated."""
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
