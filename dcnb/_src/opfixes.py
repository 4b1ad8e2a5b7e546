"""Fixes for gaps in DaCe 2.0.0b1, made through its own extension points (registered backward rules and
expansions). One class or function per gap, each named for it and tested in tests/compile/test_opfixes.py.

Importing this module installs them.
"""

from __future__ import annotations

from dace.autodiff.implementations.onnx_ops import DefaultEinsumBackward
from dace.libraries.onnx.nodes.onnx_op_registry import get_onnx_node
from dace.registry import autoregister_params

from .frontend import OPSET


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


for _version in (OPSET, -1):
    get_onnx_node("Einsum", _version).default_backward_implementation = "dcnb"
