"""Once, on the imported forward SDFG: lower what autodiff would lower anyway, and what one node does better."""

from __future__ import annotations

import copy

import dace
import networkx as nx
from dace.autodiff.base_abc import find_backward_implementation
from dace.frontend.common.einsum import EinsumParser
from dace.libraries.onnx.nodes.onnx_op import ONNXOp
from dace.sdfg import nodes
from dace.transformation.dataflow import TrivialMapElimination
from dace.transformation.onnx.optimize import expand_onnx_nodes
from dace.transformation.onnx.replacement import onnx_constant_or_none

from ..export_rules import HARDTANH
from ..fixes.normalization import ACTIVATIONS, BatchNormActivation, BatchNormalizationExpansion
from .auto_optimize import repeated_in_each_state
from .simplify import simplify


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
    simplify(sdfg)


def no_single_point_dimensions(sdfg: dace.SDFG) -> int:
    """Take the dimensions of one iteration out of the maps; returns how many maps changed.

    gap: over an array with an axis of one element (a batch of one), DaCe's expansions wrote ``t[0, i]`` where the
    next map read ``t[__i0, i]``, and MapFusion, unable to tell the two apart, fused nothing: map_fusion and
    tasklet_fusion matched nothing in a batch of one.
    """
    return repeated_in_each_state(sdfg, TrivialMapElimination)


def transposes_into_products(sdfg: dace.SDFG) -> int:
    """Read a transposed operand of a matrix product (an Einsum) in place: the product's equation names its axes
    in the order the array has them, and the BLAS call reads it transposed; returns how many transposes went.

    gap: PyTorch exports ``nn.Linear`` as a MatMul of a Transpose of the weight, which DaCe copied on every call,
    and autodiff transposed the weight's gradient back (two copies per layer and step, 5% of a BERT layer's
    forward+backward); only where the product stays one BLAS call (DaCe's einsum: a batched GEMM) is it read in
    place.
    """
    folded = 0
    for state in sdfg.states():
        for transpose in [n for n in state.nodes() if isinstance(n, ONNXOp) and n.schema.name == "Transpose"]:
            if state.in_degree(transpose) != 1 or state.out_degree(transpose) != 1:
                continue
            source, result = state.in_edges(transpose)[0], state.out_edges(transpose)[0].dst
            readers = state.out_edges(result)
            if not (isinstance(result, nodes.AccessNode) and sdfg.arrays[result.data].transient and readers):
                continue
            if state.in_degree(result) != 1 or not _only_access(sdfg, result):
                continue
            if not all(isinstance(e.dst, ONNXOp) and e.dst.schema.name == "Einsum" for e in readers):
                continue
            # a matrix (a weight) only: DaCe's einsum takes a batched GEMM whose operand lists its axes in another
            # order than the result (an activation's [1, 0, 2]) for one in the same order, and computes it wrong
            perm = list(transpose.perm) if transpose.perm else [1, 0]
            if perm != [1, 0] or not isinstance(source.src, nodes.AccessNode) or sdfg.arrays[source.src.data].transient:
                continue
            equations = [_untransposed(e.dst.equation, int(e.dst_conn.split("__")[-1]), perm) for e in readers]
            if any(eq is None for eq in equations):
                continue
            for edge, equation in zip(list(readers), equations):
                edge.dst.equation = equation
                state.add_edge(source.src, source.src_conn, edge.dst, edge.dst_conn, copy.deepcopy(source.data))
                state.remove_edge(edge)
            state.remove_node(result)
            state.remove_node(transpose)
            sdfg.remove_data(result.data, validate=False)
            folded += 1
    return folded


def _untransposed(equation: str, operand: int, perm: list[int]) -> str | None:
    """``equation`` with operand ``operand`` read before its transpose by ``perm``, where it stays a batched GEMM."""
    inputs, output = equation.replace(" ", "").split("->")
    subscripts = inputs.split(",")
    old = subscripts[operand]
    if len(old) != len(perm) or "." in old:
        return None
    new = [""] * len(perm)
    for k, axis in enumerate(perm):
        new[axis] = old[k]
    subscripts[operand] = "".join(new)
    folded = f"{','.join(subscripts)}->{output}"
    return folded if EinsumParser(equation).is_bmm() and EinsumParser(folded).is_bmm() else None


def activations_into_norms(sdfg: dace.SDFG) -> int:
    """Take the activation that is a training-mode BatchNormalization's one reader (a ReLU, a ReLU6), or that reads
    the sum of its output and another array alone (a residual connection's), into it (a ``BatchNormActivation``:
    one pass adds and writes the activation's output, one reads its gradient); returns how many.

    gap: DaCe's ONNX nodes are one op each, and the normalization (dcnb's C++ passes over rows of channels, which
    map_fusion cannot reach) wrote its output for the activation (or the sum) to read and write again, and the
    forward stored them for the backward: ResNet-50's 49 ReLUs took 92 of a training step's 1250 ms after its
    BatchNorms; its 16 residual sums' forward stored 165 MB more
    """
    fused = 0
    for state in sdfg.states():
        for norm in [n for n in state.nodes() if isinstance(n, ONNXOp) and n.schema.name == "BatchNormalization"]:
            found = _activation_after(sdfg, state, norm)
            if found is None:
                continue
            between, activation, bounds, residual, result = found
            names = [norm.label] + (["Add"] if residual else []) + [activation.schema.name]
            node = BatchNormActivation(
                "_".join(names), epsilon=float(norm.epsilon), momentum=float(norm.momentum),
                activation=activation.schema.name, bounds=bounds,
            )
            # the ONNX node's connectors, typed as they are
            node.in_connectors, node.out_connectors = dict(norm.in_connectors), dict(norm.out_connectors)
            state.add_node(node)
            for edge in state.in_edges(norm):
                state.add_edge(edge.src, edge.src_conn, node, edge.dst_conn, copy.deepcopy(edge.data))
            if residual is not None:
                node.add_in_connector("R", residual.dst.in_connectors[residual.dst_conn])
                state.add_edge(residual.src, residual.src_conn, node, "R", copy.deepcopy(residual.data))
            for edge in state.out_edges(norm):
                if edge.dst is not between[0]:
                    state.add_edge(node, edge.src_conn, edge.dst, edge.dst_conn, copy.deepcopy(edge.data))
            out = state.out_edges(activation)[0]
            state.add_edge(node, "Y", result, out.dst_conn, copy.deepcopy(out.data))
            bound_nodes = [e.src for e in state.in_edges(activation) if e.dst_conn != _data(activation)]
            for removed in (norm, *between, activation):
                state.remove_node(removed)
            for constant in bound_nodes:
                if state.degree(constant) == 0:
                    state.remove_node(constant)
            for written in between:
                if isinstance(written, nodes.AccessNode):
                    sdfg.remove_data(written.data, validate=False)
            fused += 1
    return fused


def _activation_after(sdfg: dace.SDFG, state: dace.SDFGState, norm: ONNXOp):
    """(the nodes between ``norm`` and the activation: Y's access node, and where there is a sum the Add and its
    output's; the activation; its bounds; the edge bringing the Add's other input, or None; the activation's
    output's access node) where ``norm`` is in training mode and its Y goes to one activation of ``ACTIVATIONS``
    alone, or to one Add of an array of its shape whose sum goes to the activation alone."""
    if not norm.training_mode or not BatchNormalizationExpansion.forward_can_be_applied(norm, state, sdfg):
        return None
    written = _read_alone(sdfg, state, norm, "Y")
    if written is None:
        return None
    between, residual = [written], None
    edge = state.out_edges(written)[0]
    if isinstance(edge.dst, ONNXOp) and edge.dst.schema.name == "Add":
        add, shape = edge.dst, sdfg.arrays[written.data].shape
        others = [e for e in state.in_edges(add) if e is not edge]
        if len(others) != 1 or not isinstance(others[0].src, nodes.AccessNode):
            return None
        # the other input, which the fused node will read, must not be reached from the norm (from its running
        # statistics): reading it there would close a cycle
        if nx.has_path(state.nx, norm, others[0].src):
            return None
        residual = others[0]
        added = sdfg.arrays[residual.data.data]
        whole = residual.data.subset.covers(dace.subsets.Range.from_array(added))
        if not whole or added.shape != shape or added.dtype != sdfg.arrays[written.data].dtype:
            return None
        summed = _read_alone(sdfg, state, add, "C")
        if summed is None or sdfg.arrays[summed.data].shape != shape:
            return None
        between += [add, summed]
        edge = state.out_edges(summed)[0]
    activation = edge.dst
    if not (isinstance(activation, ONNXOp) and activation.schema.name in ACTIVATIONS):
        return None
    if edge.dst_conn != _data(activation):
        return None
    bounds = _constant_bounds(sdfg, state, activation)
    if bounds is None or state.out_degree(activation) != 1:
        return None
    result = state.out_edges(activation)[0].dst
    if not isinstance(result, nodes.AccessNode) or sdfg.arrays[result.data].shape != sdfg.arrays[written.data].shape:
        return None
    return between, activation, bounds, residual, result


def _read_alone(sdfg: dace.SDFG, state: dace.SDFGState, op: nodes.Node, connector: str) -> nodes.AccessNode | None:
    """The access node of what ``op`` writes through ``connector``, where that is an array of the SDFG's own, written
    there alone and read by one op alone, and that node is its one access."""
    out = [e for e in state.out_edges(op) if e.src_conn == connector]
    if len(out) != 1 or not isinstance(out[0].dst, nodes.AccessNode):
        return None
    written = out[0].dst
    if not sdfg.arrays[written.data].transient or state.in_degree(written) != 1 or state.out_degree(written) != 1:
        return None
    return written if _only_access(sdfg, written) else None


def _constant_bounds(sdfg: dace.SDFG, state: dace.SDFGState, activation: ONNXOp) -> list[float] | None:
    """The activation's bounds, where it has none or constant ones both sides that ``ACTIVATIONS`` takes (a
    hardtanh's Clip); else None."""
    others = {e.dst_conn: e.src for e in state.in_edges(activation) if e.dst_conn != _data(activation)}
    if activation.schema.name != "Clip":
        return None if others else []
    if activation.backward_implementation != HARDTANH or set(others) != {"min", "max"}:
        return None
    values = [onnx_constant_or_none(sdfg, others[n].data) for n in ("min", "max")]
    return [float(v) for v in values] if all(isinstance(v, (int, float)) for v in values) else None


def _data(op: ONNXOp) -> str:
    """The connector of an op's first input (Relu's ``X``, Clip's ``input``)."""
    return op.schema.inputs[0].name


def _only_access(sdfg: dace.SDFG, node: nodes.AccessNode) -> bool:
    """Whether ``node`` is the one access node of its array in ``sdfg``."""
    return not any(n.data == node.data and n is not node for s in sdfg.states() for n in s.data_nodes())
