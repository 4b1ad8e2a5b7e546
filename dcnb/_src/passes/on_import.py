"""Once, on the imported forward SDFG: lower what autodiff would lower anyway."""

from __future__ import annotations

import dace
from dace.autodiff.base_abc import find_backward_implementation
from dace.libraries.onnx.nodes.onnx_op import ONNXOp
from dace.transformation.onnx.optimize import expand_onnx_nodes


def lower(sdfg: dace.SDFG) -> None:
    """Expand the ONNX nodes that autodiff would expand anyway (those without a backward rule), then simplify.

    Done before autodiff, so that pre-autodiff transformations see maps and tasklets, as in DaCeML's recipes.
    """
    while True:
        targets = {
            node
            for node, parent in sdfg.all_nodes_recursive()
            if isinstance(node, ONNXOp) and find_backward_implementation(parent.sdfg, parent, node) is None
        }
        if not targets:
            break
        expand_onnx_nodes(sdfg, predicate=lambda n: n in targets)
    sdfg.simplify()
