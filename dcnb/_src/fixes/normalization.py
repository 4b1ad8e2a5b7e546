"""Normalization ops: BatchNormalization in training mode."""

from __future__ import annotations

import math

import dace
import numpy as np
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.libraries.onnx.op_implementations.img_op_implementations import PureBatchNormalization
from dace.libraries.onnx.op_implementations.utils import program_for_node
from dace.sdfg.utils import in_desc_with_name

from .registry import pure_expansion


@pure_expansion("BatchNormalization", name="dcnb")
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
