"""Linear algebra: Einsum's backward."""

from __future__ import annotations

from dace.autodiff.implementations.onnx_ops import DefaultEinsumBackward
from dace.registry import autoregister_params

from .registry import default_backward


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


default_backward("Einsum")
