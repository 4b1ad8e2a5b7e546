"""Copies that move no element become views: a transient written whole and then copied whole into an array of another
shape, both contiguous, is a view of that array (its writer writes it in place), and of a permutation between arrays
in one memory order, one side is a view of the other.

gap: DaCe's expansion of a matrix product over (N, H, W, C) images views its operands as matrices, but where
auto_optimize inlines it, its result becomes a matrix of its own, copied into the image by a loop of one element at a
time through divisions and remainders (``py_mod``): on ConvNeXt-T (4x3x224x224, training) those copies took 39% of
the forward's samples, its `auto_optimize` step 1.7x eager's time against the naive step's 1.35x.
"""

from __future__ import annotations

import math
import re

import dace
from dace import data as dt
from dace.libraries.linalg.nodes.ttranspose import TensorTranspose
from dace.libraries.onnx.nodes.onnx_op import ONNXOp
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
        accesses = _accesses(nested)
        for state in nested.states():
            for edge in list(state.edges()):
                if _reshaping_copy(state, edge, accesses):
                    source, target = edge.src.data, edge.dst.data
                    nested.arrays[source] = _view_of(nested.arrays[source], nested.arrays[target])
                    edge.data = dace.Memlet.from_array(target, nested.arrays[target])
                    changed += 1
    return changed


def permutations_as_views(sdfg: dace.SDFG) -> int:
    """Make one side of each permutation that moves no element a view of the other; returns how many.

    gap: a Transpose between arrays in one memory order (an image laid out channels-last and its (N, H, W, C)
    permutation: ConvNeXt's blocks, after the channels_last action) still copied every element into an array of its
    own, four whole images a block with the backward's: 100 of ConvNeXt-T's 684 MB of scratch at batch 4.
    """
    changed = 0
    for nested in sdfg.all_sdfgs_recursive():
        accesses = _accesses(nested)
        for state in nested.states():
            removed: set[nodes.Node] = set()
            for node in [n for n in state.nodes() if state.entry_node(n) is None]:
                ends = None if node in removed else _permutation(state, node)
                sides = ends and _view_and_viewed(state, *ends, accesses)
                if not sides:
                    continue
                view, viewed = sides
                scope = _scope(state, node)
                removed.update(scope)
                state.remove_nodes_from(scope)
                nested.arrays[view.data] = _view_of(nested.arrays[view.data], nested.arrays[viewed.data])
                memlet = dace.Memlet.from_array(viewed.data, nested.arrays[viewed.data])
                state.add_edge(ends[0], None, ends[1], None, memlet)
                changed += 1
    return changed


#: the access nodes of each array of an SDFG, with their states
Accesses = dict[str, list[tuple[dace.SDFGState, nodes.AccessNode]]]


def _accesses(sdfg: dace.SDFG) -> Accesses:
    found: Accesses = {}
    for state in sdfg.states():
        for node in state.data_nodes():
            found.setdefault(node.data, []).append((state, node))
    return found


def _view_of(desc: dt.Array, viewed: dt.Array) -> dt.View:
    view = dt.View.view(desc)
    view.lifetime, view.storage = dace.AllocationLifetime.Scope, viewed.storage
    return view


def _permutation(state: dace.SDFGState, node: nodes.Node) -> tuple[nodes.AccessNode, nodes.AccessNode] | None:
    """The access nodes ``node`` reads and writes where it puts every element of the one array at its own place in
    the other: ONNX's Transpose, a TensorTranspose, a map nest of one assignment, or a nested SDFG of either (DaCe's
    expansions of the first)."""
    if isinstance(node, nodes.MapEntry):
        ins, outs = state.in_edges(node), state.out_edges(state.exit_node(node))
    elif isinstance(node, (TensorTranspose, nodes.NestedSDFG)) or _transpose(node):
        ins, outs = state.in_edges(node), state.out_edges(node)
    else:
        return None
    if len(ins) != 1 or len(outs) != 1 or outs[0].data.wcr is not None:
        return None
    src, dst = ins[0].src, outs[0].dst
    if not (isinstance(src, nodes.AccessNode) and isinstance(dst, nodes.AccessNode)):
        return None
    a, b = state.sdfg.arrays[src.data], state.sdfg.arrays[dst.data]
    if not (_plain(a) and _plain(b)) or a.dtype != b.dtype or a.total_size != b.total_size:
        return None
    if not (_whole(ins[0].data, a) and _whole(outs[0].data, b)) or not _in_place(state, node, a, b):
        return None
    return src, dst


def _plain(desc: dt.Data) -> bool:
    """A dense array of numbers for shape and strides, starting at its pointer."""
    return type(desc) is dt.Array and concrete(desc) and desc.start_offset == 0 and all(o == 0 for o in desc.offset)


def _in_place(state: dace.SDFGState, node: nodes.Node, a: dt.Array, b: dt.Array) -> bool:
    """Whether ``node`` (``_permutation``'s kinds) writes each element of ``a`` at its own offset in ``b``."""
    if isinstance(node, TensorTranspose) or _transpose(node):
        axes = list(node.axes) if isinstance(node, TensorTranspose) else _perm(node, a)
        return (
            getattr(node, "alpha", 1) == 1
            and getattr(node, "beta", 0) == 0
            and all(int(b.shape[i]) == int(a.shape[k]) for i, k in enumerate(axes))
            and all(int(b.strides[i]) == int(a.strides[k]) for i, k in enumerate(axes) if int(b.shape[i]) != 1)
        )
    if isinstance(node, nodes.NestedSDFG):
        inner = node.sdfg
        if inner.number_of_nodes() != 1 or len(node.in_connectors) != 1 or len(node.out_connectors) != 1:
            return False
        (inside,) = inner.states()
        named = {next(iter(node.in_connectors)): a, next(iter(node.out_connectors)): b}
        if any(not _plain(inner.arrays[n]) or _layout(inner.arrays[n]) != _layout(d) for n, d in named.items()):
            return False
        tops = [n for n in inside.nodes() if inside.entry_node(n) is None and not isinstance(n, nodes.AccessNode)]
        accessed = {n.data for n in inside.data_nodes()}
        if len(tops) != 1 or accessed != set(named) or len(inside.data_nodes()) != 2:
            return False
        ends = _permutation(inside, tops[0])
        return ends is not None and (ends[0].data, ends[1].data) == tuple(named)
    # a map nest: one tasklet assigning what it reads, every iteration reading and writing one offset
    scope = _scope(state, node)
    tasklets = [n for n in scope if isinstance(n, nodes.Tasklet)]
    if len(tasklets) != 1 or any(not isinstance(n, (nodes.MapEntry, nodes.MapExit, nodes.Tasklet)) for n in scope):
        return False
    (tasklet,) = tasklets
    if state.in_degree(tasklet) != 1 or state.out_degree(tasklet) != 1:
        return False
    (read,), (written,) = state.in_edges(tasklet), state.out_edges(tasklet)
    assignment = _ASSIGNMENT.fullmatch(tasklet.code.as_string)
    if not assignment or assignment.groups() != (written.src_conn, read.dst_conn):
        return False
    iterations = math.prod(n.map.range.num_elements() for n in scope if isinstance(n, nodes.MapEntry))
    if iterations != a.total_size or read.data.wcr is not None or written.data.wcr is not None:
        return False
    offsets = [_offset(e.data, state.sdfg.arrays[e.data.data]) for e in (read, written)]
    return None not in offsets and dace.symbolic.simplify(offsets[0] - offsets[1]) == 0


def _transpose(node: nodes.Node) -> bool:
    return isinstance(node, ONNXOp) and node.schema.name == "Transpose"


def _perm(node: ONNXOp, a: dt.Array) -> list[int]:
    return list(node.perm) if node.perm is not None else list(reversed(range(len(a.shape))))


#: a tasklet of one assignment, Python's or C++'s: ``_out = _inp``
_ASSIGNMENT = re.compile(r"\s*(\w+)\s*=\s*(\w+)\s*;?\s*")


def _offset(memlet: dace.Memlet, desc: dt.Data):
    """The offset of the one element ``memlet`` moves, else None."""
    if memlet.subset is None or memlet.other_subset is not None or memlet.subset.num_elements() != 1:
        return None
    return sum(s * i for s, i in zip(desc.strides, memlet.subset.min_element()))


def _layout(desc: dt.Array) -> tuple:
    return tuple(int(n) for n in desc.shape), tuple(int(s) for s in desc.strides)


def _scope(state: dace.SDFGState, node: nodes.Node) -> list[nodes.Node]:
    return state.scope_subgraph(node).nodes() if isinstance(node, nodes.MapEntry) else [node]


def _view_and_viewed(
    state: dace.SDFGState,
    src: nodes.AccessNode,
    dst: nodes.AccessNode,
    accesses: Accesses,
) -> tuple[nodes.AccessNode, nodes.AccessNode] | None:
    """Which side of a permutation from ``src`` to ``dst`` becomes a view of the other, if either may."""
    arrays = state.sdfg.arrays
    a, b = arrays[src.data], arrays[dst.data]
    if src.data == dst.data or not {a.storage, b.storage} <= _HOST or src.setzero or dst.setzero:
        return None
    # the source written here and read by the permutation alone: its writers write the target in place
    if (
        a.transient
        and len(accesses[src.data]) == 1
        and len(accesses[dst.data]) == 1
        and state.in_degree(src) > 0
        and state.out_degree(src) == 1
        and dst.data not in _read_before(state, src)
    ):
        return src, dst
    # the target written by the permutation alone, the source by nothing after it: its readers read the source
    if (
        b.transient
        and len(accesses[dst.data]) == 1
        and state.in_degree(dst) == 1
        and all(where.in_degree(n) == 0 for where, n in accesses[src.data] if n is not src)
    ):
        return dst, src
    return None


def _reshaping_copy(state: dace.SDFGState, edge: MultiConnectorEdge, accesses: Accesses) -> bool:
    """Whether ``edge`` copies such a transient (the module's docstring)."""
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
    if len(accesses[src.data]) != 1 or state.in_degree(src) != 1 or state.out_degree(src) != 1:
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
    return _plain(desc) and contiguous(desc) and int(desc.total_size) == math.prod(int(n) for n in desc.shape)


def _whole(memlet: dace.Memlet, a: dt.Array) -> bool:
    subsets = [s for s in (memlet.subset, memlet.other_subset) if s is not None]
    return all(s.num_elements() == a.total_size for s in subsets)
