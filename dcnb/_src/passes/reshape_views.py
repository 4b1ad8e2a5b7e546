"""A transient written whole and then copied whole into an array of another shape, both contiguous, becomes a view of
that array: the writer writes it in place.

gap: DaCe's expansion of a matrix product over (N, H, W, C) images views its operands as matrices, but where
auto_optimize inlines it, its result becomes a matrix of its own, copied into the image by a loop of one element at a
time through divisions and remainders (``py_mod``): on ConvNeXt-T (4x3x224x224, training) those copies took 39% of
the forward's samples, its `auto_optimize` step 1.7x eager's time against the naive step's 1.35x.
"""

from __future__ import annotations

import math

import dace
from dace import data as dt
from dace.sdfg import nodes
from dace.sdfg.graph import MultiConnectorEdge

from ..fixes.cpp import contiguous
from ..fixes.library_nodes import concrete

#: the host's memory: an argument's default storage, a transient's heap or stack (auto_optimize's small arrays)
_HOST = {dace.StorageType.Default, dace.StorageType.CPU_Heap, dace.StorageType.Register}


def copies_as_views(sdfg: dace.SDFG) -> int:
    """Make each such transient a view of the array it was copied into; returns how many."""
    changed = 0
    for nested in sdfg.all_sdfgs_recursive():
        accesses: dict[str, int] = {}
        for state in nested.states():
            for node in state.data_nodes():
                accesses[node.data] = accesses.get(node.data, 0) + 1
        for state in nested.states():
            for edge in list(state.edges()):
                if _reshaping_copy(state, edge, accesses):
                    source, target = edge.src.data, edge.dst.data
                    view = dt.View.view(nested.arrays[source])
                    view.lifetime, view.storage = dace.AllocationLifetime.Scope, nested.arrays[target].storage
                    nested.arrays[source] = view
                    edge.data = dace.Memlet.from_array(target, nested.arrays[target])
                    changed += 1
    return changed


def _reshaping_copy(state: dace.SDFGState, edge: MultiConnectorEdge, accesses: dict[str, int]) -> bool:
    """Whether ``edge`` copies such a transient (the module's docstring); ``accesses``: access nodes by array."""
    src, dst = edge.src, edge.dst
    if not (isinstance(src, nodes.AccessNode) and isinstance(dst, nodes.AccessNode)) or edge.data.wcr is not None:
        return False
    arrays = state.sdfg.arrays
    a, b = arrays[src.data], arrays[dst.data]
    if type(a) is not dt.Array or type(b) is not dt.Array or not a.transient or src.data == dst.data:
        return False
    if tuple(a.shape) == tuple(b.shape) or a.dtype != b.dtype or not {a.storage, b.storage} <= _HOST:
        return False
    # the transient's only access: written once, read by this copy alone, nowhere else in its SDFG
    if accesses.get(src.data) != 1 or state.in_degree(src) != 1 or state.out_degree(src) != 1:
        return False
    if state.entry_node(src) is not None or not (_contiguous(a) and _contiguous(b)):
        return False
    if not (edge.data.volume == a.total_size == b.total_size and _whole(edge.data, a)):
        return False
    # what writes the transient must not read the array (a product into its own operand would then overwrite it)
    return dst.data not in _read_before(state, src)


def _read_before(state: dace.SDFGState, node: nodes.AccessNode) -> set[str]:
    """The arrays whose access nodes lead to ``node`` in ``state``."""
    seen, frontier, names = {node}, [node], set()
    while frontier:
        for edge in state.in_edges(frontier.pop()):
            if edge.src not in seen:
                seen.add(edge.src)
                frontier.append(edge.src)
                if isinstance(edge.src, nodes.AccessNode):
                    names.add(edge.src.data)
    return names


def _contiguous(desc: dt.Array) -> bool:
    if not concrete(desc) or desc.start_offset != 0 or any(o != 0 for o in desc.offset):
        return False
    return contiguous(desc) and int(desc.total_size) == math.prod(int(n) for n in desc.shape)


def _whole(memlet: dace.Memlet, a: dt.Array) -> bool:
    subsets = [s for s in (memlet.subset, memlet.other_subset) if s is not None]
    return all(s.num_elements() == a.total_size for s in subsets)
