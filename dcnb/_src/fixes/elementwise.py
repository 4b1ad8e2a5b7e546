"""Elementwise ops: activations DaCe has no expansion for, and Where's backward under broadcasting."""

from __future__ import annotations

import dace
from dace.autodiff.base_abc import BackwardImplementation
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.libraries.onnx.op_implementations.utils import program_for_node
from dace.registry import autoregister_params
from dace.sdfg.utils import in_desc_with_name

from .array_ops import broadcast_index
from .cpp import at, cpp_backward, forward_in, forward_out, loops, zero
from .registry import default_backward, pure_expansion


@pure_expansion("HardSigmoid")
class HardSigmoidExpansion(ONNXForward):
    # gap: DaCe has no implementation of the ONNX op HardSigmoid (nn.Hardsigmoid)
    @staticmethod
    def forward(node, state, sdfg):
        alpha, beta = node.alpha, node.beta
        return _elementwise(
            node, state, sdfg, lambda t: f"lambda x: max({t}(0), min({t}(1), {t}({alpha!r}) * x + {t}({beta!r})))"
        )


@pure_expansion("HardSwish")
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


@autoregister_params(op="Where", name="dcnb")
class WhereBackward(BackwardImplementation):
    # gap: DaCe's Where backward assumes X, Y and the condition have the output's shape; masked_fill with a
    # scalar (causal attention's -inf) broadcasts, and its backward failed to parse (incompatible subsets)
    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        cond, out = forward_in(forward_node, context, "condition"), forward_out(forward_node, context, "output")
        wanted = [n for n in ("X", "Y") if n in required_gradients]
        index = [f"i{k}" for k in range(len(out.shape))]
        head, tail = loops(index, out.shape)
        body = "".join(zero(f"{n}_grad", forward_in(forward_node, context, n)) for n in wanted)
        body += head + f"const bool take = {at('condition', cond, broadcast_index(cond, out.shape, index))};\n"
        body += f"const auto dy = {at('output_grad', out, index)};\n"
        for n, when in (("X", "take"), ("Y", "!take")):
            if n in wanted:
                desc = forward_in(forward_node, context, n)
                body += f"if ({when}) {at(f'{n}_grad', desc, broadcast_index(desc, out.shape, index))} += dy;\n"
        body += tail
        return cpp_backward(
            forward_node, context, ["condition", "output_grad", *(f"{n}_grad" for n in wanted)], body
        )


default_backward("Where")
