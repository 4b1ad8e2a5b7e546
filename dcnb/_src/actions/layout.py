"""channels_last: a convolutional network's images stored channels-last (NHWC), as PyTorch stores a tensor of
``memory_format=torch.channels_last``.

An SDFG's arrays are (N, C, H, W) as ONNX gives them, and each is laid out as its strides say: the action gives the
images around the convolutions strides that put a pixel's channels side by side. PyTorch's convolutions, which
dcnb's binaries call with their operands' strides (fixes/conv.py), then run oneDNN's channels-last kernels, as
eager's do on a model made ``.to(memory_format=torch.channels_last)`` and as torch.compile lays them out itself;
BatchNormalization's loops go over rows of channels (fixes/normalization.py) and every CPU build iterates
elementwise maps in memory order (passes/memory_order.py).

It acts before autodiff: autodiff copies an array's descriptor to its gradient, so the backward's images and what
the forward stores for it are laid out alike. An image is taken only where every node around it indexes it through
its strides (the ops in ``_STRIDED_OPS``, maps), it is one of the SDFG's own (transient, no view of it), it has
``MIN_PIXELS`` pixels or more, and it is reached from a convolution through such images and nodes; the inputs and
outputs stay as PyTorch hands them.
"""

from __future__ import annotations

import math

import dace
from dace import data as dt
from dace.libraries.onnx.nodes.onnx_op import ONNXOp
from dace.sdfg import nodes

from ..fixes.cpp import channels_last, channels_last_strides
from ..fixes.library_nodes import concrete
from ..fixes.normalization import BatchNormActivation
from .matching import Where

#: ONNX ops whose expansions and backward rules (DaCe's programs of maps, dcnb's C++ loops) index every array
#: through its strides (and dcnb's BatchNormActivation, a BatchNormalization's)
_STRIDED_OPS = {
    "Conv",
    "BatchNormalization",
    "Relu",
    "LeakyRelu",
    "Clip",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "Add",
    "Sub",
    "Mul",
    "MaxPool",
    "AveragePool",
    "Pad",
    "GlobalAveragePool",
    "Transpose",
}

#: strided ops whose output's axes are their input's permuted: an image is laid out on either side of one, not
#: reached across it (the other side's second axis is not its channels: ConvNeXt's blocks permute each image to
#: (N, H, W, C) for their LayerNorm and linear layers, and back)
_PERMUTING_OPS = {"Transpose"}


#: the fewest pixels of an image laid out channels-last. Over smaller ones oneDNN's channels-last convolutions were
#: the slower (forward+backward, batch 8, PyTorch's own kernels, an Intel Xeon's 2 cores: 0.53-0.81x the (N, C, H, W)
#: time over 56x56 and 28x28 images, 0.96-1.0x over 14x14, 1.0-1.7x over 7x7: ResNet-50's last stage)
MIN_PIXELS = 14 * 14


def images(sdfg: dace.SDFG, where: Where) -> list[nodes.AccessNode]:
    """An access node of each image the action lays out channels-last (the module's docstring), in ``sdfg``'s
    one state; ``where`` narrows them to the arrays it names."""
    taken = _strided(sdfg)
    found: dict[str, nodes.AccessNode] = {}
    for state in sdfg.states():
        by_name: dict[str, list[nodes.AccessNode]] = {}
        for node in state.data_nodes():
            by_name.setdefault(node.data, []).append(node)
        # from the convolutions, through the images and the nodes that index them by their strides
        frontier = [n for n in state.data_nodes() if n.data in taken and _beside_convolution(state, n)]
        reached = set(frontier)
        while frontier:
            node = frontier.pop()
            found.setdefault(node.data, node)
            for op in _neighbours(state, node):
                for other in _across(state, op):
                    if isinstance(other, nodes.AccessNode) and other.data in taken and other not in reached:
                        reached.add(other)
                        frontier.append(other)
            for other in by_name[node.data]:  # every access node of an image reached
                if other not in reached:
                    reached.add(other)
                    frontier.append(other)
    return [n for name, n in sorted(found.items()) if where is None or name in where]


def apply(sdfg: dace.SDFG, where: Where) -> int:
    """Lay the images ``images`` finds out channels-last; returns how many."""
    found = images(sdfg, where)
    for node in found:
        desc = sdfg.arrays[node.data]
        desc.strides = channels_last_strides(tuple(int(n) for n in desc.shape))
    return len(found)


def _strided(sdfg: dace.SDFG) -> set[str]:
    """The transient images of ``sdfg`` (no views, not yet channels-last) that only strided nodes touch."""
    candidates = {
        name
        for name, desc in sdfg.arrays.items()
        if type(desc) is dt.Array
        and desc.transient
        and len(desc.shape) >= 3
        and concrete(desc)
        and int(desc.shape[1]) > 1
        and math.prod(int(n) for n in desc.shape[2:]) >= MIN_PIXELS
        and not channels_last(desc)
    }
    for state in sdfg.states():
        for node in state.data_nodes():
            if node.data in candidates and not all(_indexes_by_strides(sdfg, n) for n in _neighbours(state, node)):
                candidates.discard(node.data)
    return candidates


def _neighbours(state: dace.SDFGState, node: nodes.Node) -> list[nodes.Node]:
    return [e.dst for e in state.out_edges(node)] + [e.src for e in state.in_edges(node)]


def _across(state: dace.SDFGState, node: nodes.Node) -> list[nodes.Node]:
    """What ``node`` connects an image to: its neighbours, and a map's other side's; nothing across a permutation."""
    if isinstance(node, ONNXOp) and node.schema.name in _PERMUTING_OPS:
        return []
    if isinstance(node, nodes.MapEntry):
        return _neighbours(state, node) + _neighbours(state, state.exit_node(node))
    if isinstance(node, nodes.MapExit):
        return _neighbours(state, node) + _neighbours(state, state.entry_node(node))
    return _neighbours(state, node)


def _indexes_by_strides(sdfg: dace.SDFG, node: nodes.Node) -> bool:
    if isinstance(node, (nodes.MapEntry, nodes.MapExit)):
        return True  # memlets: DaCe's code generator indexes them through the strides
    if isinstance(node, nodes.AccessNode):
        return not isinstance(sdfg.arrays[node.data], dt.View)  # a copy, strided on both sides
    return isinstance(node, BatchNormActivation) or isinstance(node, ONNXOp) and node.schema.name in _STRIDED_OPS


def _beside_convolution(state: dace.SDFGState, node: nodes.AccessNode) -> bool:
    return any(isinstance(n, ONNXOp) and n.schema.name == "Conv" for n in _neighbours(state, node))
