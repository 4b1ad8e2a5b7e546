"""A forward SDFG before autodiff -> the forward and backward SDFGs that run (a Program)."""

from __future__ import annotations

import copy
import dataclasses
import types

import dace
from dace import data as dt
from dace.autodiff import AutoDiffException
from dace.autodiff.base_abc import find_backward_implementation
from dace.autodiff.torch import make_backward_function
from dace.libraries.onnx.nodes.onnx_op import ONNXOp
from dace.sdfg import nodes
from dace.transformation.onnx.optimize import expand_onnx_nodes

from . import opfixes
from .errors import StepError
from .frontend import Imported


@dataclasses.dataclass
class Program:
    """The SDFGs of one session state, ready to compile."""

    forward: dace.SDFG
    backward: dace.SDFG | None
    #: forward arrays the backward reads, by name (inputs, outputs and stored intermediates)
    forwarded: list[str]
    #: forward input/parameter name -> gradient array in the backward SDFG
    input_grads: dict[str, str]
    #: forward output name -> gradient array the backward SDFG receives
    output_grads: dict[str, str]

    def stored_bytes(self, imported: Imported) -> int:
        """Bytes the forward stores only for the backward (not inputs, parameters, outputs or constants)."""
        given = set(imported.inputs) | set(imported.param_paths) | set(imported.outputs) | set(imported.constants)
        return sum(
            _nbytes(self.forward.arrays[name]) for name in self.forwarded if name not in given
        )


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


def differentiate(pre: dace.SDFG, imported: Imported, wrt: list[str]) -> Program:
    """Generate the backward SDFG of a copy of ``pre``, with gradients for the arrays in ``wrt``."""
    forward = copy.deepcopy(pre)
    if not wrt:
        return Program(forward, None, [], {}, {})
    if len(forward.nodes()) != 1:
        raise StepError(
            f"autodiff needs the forward SDFG in one state, but it has {len(forward.nodes())}; "
            "apply this transformation after autodiff instead"
        )
    opfixes.split_shared_map_inputs(forward)
    model = types.SimpleNamespace(sdfg=forward, outputs=imported.outputs)
    try:
        forward, backward, result, forwarded = make_backward_function(model, wrt)
    except AutoDiffException as e:
        raise StepError(f"DaCe's autodiff failed: {e}") from e
    except AssertionError as e:
        # DaCe 2.0.0b1's autodiff asserts when the backward needs a value computed inside a map scope
        inner = _in_scope_intermediates(pre)
        if inner:
            raise StepError(
                "DaCe's autodiff cannot store values computed inside a map for the backward "
                f"({', '.join(sorted(inner)[:3])}); fuse maps after autodiff (map_fusion) or merge the "
                "tasklets before it (tasklet_fusion)"
            ) from e
        raise StepError("DaCe's autodiff failed on an internal assertion") from e
    opfixes.accumulate_nested_gradients(backward)
    opfixes.numeric_pi(backward)
    opfixes.float_min_max(backward)
    for sdfg in (forward, backward):
        opfixes.typed_float_literals(sdfg)
    _write_gradients_once(backward, list(result.required_grad_names.values()))
    return Program(
        forward=forward,
        backward=backward,
        forwarded=list(forwarded),
        input_grads=dict(result.required_grad_names),
        output_grads=dict(result.given_grad_names),
    )


def _write_gradients_once(sdfg: dace.SDFG, names: list[str]) -> None:
    """Where one map writes each element of a gradient exactly once, write instead of accumulating (WCR), so that
    the caller need not zero the array first: a pass over memory saved (see ``overwritten``)."""
    for name in names:
        found = _single_writer(sdfg, name)
        if found is None:
            continue
        state, edge = found
        path = state.memlet_path(edge)
        inner, exit_node = path[0], path[-1].src
        if len(path) != 2 or not isinstance(exit_node, nodes.MapExit):
            continue
        if state.entry_node(state.entry_node(exit_node)) is not None:  # a map nested in another
            continue
        if inner.data.wcr is None or inner.data.dynamic or inner.data.subset.num_elements() != 1:
            continue
        params = exit_node.map.params
        indices = [str(begin) for begin, _, _ in inner.data.subset.ndrange()]
        shape = sdfg.arrays[name].shape
        ranges = exit_node.map.range.ndrange()
        if sorted(indices) != sorted(params) or len(params) != len(shape):
            continue
        by_param = dict(zip(params, ranges))
        if all(by_param[i] == (0, size - 1, 1) for i, size in zip(indices, shape)):
            for e in path:
                e.data.wcr = None


def _single_writer(sdfg: dace.SDFG, name: str) -> tuple[dace.SDFGState, object] | None:
    """(state, edge) of the only write into ``name`` when the SDFG has one access node of it and never reads it."""
    found = [(n, s) for n, s in sdfg.all_nodes_recursive() if isinstance(n, nodes.AccessNode) and n.data == name]
    if len(found) != 1:
        return None
    node, state = found[0]
    if state.out_degree(node) or state.in_degree(node) != 1 or state.sdfg is not sdfg:
        return None
    return state, state.in_edges(node)[0]


def overwritten(sdfg: dace.SDFG, name: str) -> bool:
    """Whether ``sdfg`` writes every element of ``name`` without reading or accumulating into it."""
    found = _single_writer(sdfg, name)
    if found is None:
        return False
    state, edge = found
    path = state.memlet_path(edge)
    if any(e.data.wcr is not None or e.data.dynamic for e in path):
        return False
    shape = sdfg.arrays[name].shape
    if len(path) == 1:
        return edge.data.subset.covers(dace.subsets.Range.from_array(sdfg.arrays[name]))
    if any(not isinstance(e.dst, nodes.MapExit) for e in path[:-1]):
        return False
    # from the map's range and the inner memlet: DaCe's Vectorization leaves the outer memlet wrong
    if len(path) == 2:
        return _tiles_cover(path[0].data.subset, edge.src.map, shape)
    return _rows_cover(path[0].data.subset, [e.dst.map for e in path[:-1]], shape)


def _tiles_cover(subset, scope: nodes.Map, shape) -> bool:
    """Whether a map whose every dimension indexes one array dimension (a tile per iteration) writes all of it."""
    ranges = dict(zip(scope.params, scope.range.ndrange()))
    used = set()
    for (begin, end, step), size in zip(subset.ndrange(), shape):
        param = str(begin)
        if step != 1 or param not in ranges or param in used:
            return False
        used.add(param)
        length = dace.symbolic.simplify(end - begin + 1)
        first, last, stride = ranges[param]
        try:
            if not (first == 0 and length.is_Integer and bool(stride <= length) and bool(last + length >= size)):
                return False
        except TypeError:  # symbolic sizes: cannot tell, so the caller zeroes
            return False
    return used == set(scope.params)


def _rows_cover(subset, scopes: list[nodes.Map], shape) -> bool:
    """Whether nested maps (innermost first) whose parameters each index one array dimension write all of it: an
    inner parameter may run over a tile that an outer parameter moves along (fuse_rows' chunks of rows), provided
    the tiles leave no gap."""
    ranges = {p: r for scope in scopes for p, r in zip(scope.params, scope.range.ndrange())}
    used = set()
    for (begin, end, _), size in zip(subset.ndrange(), shape):
        param = str(begin)
        if param not in ranges:
            if begin != 0 or end != size - 1:
                return False
            continue
        if begin != end or param in used:
            return False
        used.add(param)
        if not _covers(ranges[param], size, ranges):
            return False
    return True


def _covers(rng, size, ranges) -> bool:
    """Whether a parameter's range, over every value of the outer parameter it may depend on, is 0..size-1."""
    first, last, stride = rng
    if stride != 1:
        return False
    outer = {str(s) for s in dace.symbolic.pystr_to_symbolic(first).free_symbols | dace.symbolic.pystr_to_symbolic(last).free_symbols}
    if not outer:
        return first == 0 and last == size - 1
    if len(outer) != 1 or next(iter(outer)) not in ranges:
        return False
    name = next(iter(outer))
    q = dace.symbolic.symbol(name)
    q_first, q_last, q_stride = ranges[name]
    if q_stride != 1 or q_first != 0 or dace.symbolic.pystr_to_symbolic(q_last).free_symbols:
        return False
    first, last = dace.symbolic.pystr_to_symbolic(first), dace.symbolic.pystr_to_symbolic(last)
    gapless = dace.symbolic.simplify(last + 1 - first.subs(q, q + 1)) == 0
    return gapless and first.subs(q, 0) == 0 and last.subs(q, q_last) == size - 1


def to_gpu(sdfg: dace.SDFG) -> int:
    """Place arguments in GPU memory and turn every outermost host map and library node into GPU code; returns the
    nodes moved."""
    moved = len(host_nodes(sdfg))
    # ONNX nodes expanded first, so that their maps become kernels with the rest: expanded inside a GPU schedule,
    # DaCe passed scalars of their nested SDFGs to kernels as values where pointers were needed (LayerNorm's
    # backward did not compile)
    expand_onnx_nodes(sdfg)
    sdfg.simplify()
    opfixes.accumulating_copies_to_maps(sdfg)
    for desc in sdfg.arrays.values():
        if not desc.transient and not isinstance(desc, dt.Scalar):
            desc.storage = dace.StorageType.GPU_Global
    sdfg.apply_gpu_transformations()
    return moved


#: threads per block where a kernel gives none: enough warps per block to hide memory latency
THREADS_PER_BLOCK = 256


def size_blocks(sdfg: dace.SDFG) -> None:
    """Give each CUDA kernel without a block size one shaped to its map: DaCe's default is one
    warp per block, with which Mish's fused forward+backward took 1.30x eager's time on an H100; 0.76x with 256."""
    for node, state in sdfg.all_nodes_recursive():
        if not (isinstance(node, nodes.MapEntry) and node.map.schedule == dace.ScheduleType.GPU_Device):
            continue
        if node.map.gpu_block_size is not None or any(
            isinstance(n, nodes.MapEntry) and n.map.schedule != dace.ScheduleType.Sequential
            for n in state.scope_subgraph(node, include_entry=False).nodes()
        ):
            continue  # sized already, or thread-block maps inside decide
        extents = node.map.range.size()[::-1]  # x is the innermost (last) parameter, as in DaCe's launch
        if not all(getattr(e, "is_Integer", isinstance(e, int)) for e in extents[:2]):
            continue
        x = min(-(-int(extents[0]) // 32) * 32, THREADS_PER_BLOCK)
        y = min(int(extents[1]), THREADS_PER_BLOCK // x) if len(extents) > 1 else 1
        node.map.gpu_block_size = [x, y, 1]


def host_nodes(sdfg: dace.SDFG) -> list[nodes.MapEntry | nodes.LibraryNode]:
    """Outermost maps and library nodes (softmax, matmul, ...) that would run on the host."""
    return [
        n
        for n, state in sdfg.all_nodes_recursive()
        if isinstance(n, (nodes.MapEntry, nodes.LibraryNode))
        and state.entry_node(n) is None
        and n.schedule not in dace.dtypes.GPU_SCHEDULES
    ]


def on_gpu(sdfg: dace.SDFG) -> bool:
    """Whether the SDFG's arguments live in GPU memory already (the gpu step ran)."""
    return all(
        desc.storage == dace.StorageType.GPU_Global
        for desc in sdfg.arrays.values()
        if not desc.transient and not isinstance(desc, dt.Scalar)
    )


def _in_scope_intermediates(sdfg: dace.SDFG) -> set[str]:
    return {
        n.data
        for state in sdfg.states()
        for n in state.nodes()
        if isinstance(n, nodes.AccessNode)
        and state.entry_node(n) is not None
        and any(isinstance(e.src, nodes.CodeNode) for e in state.in_edges(n))
        and any(isinstance(e.dst, nodes.CodeNode) for e in state.out_edges(n))
    }


def counts(sdfg: dace.SDFG | None) -> dict[str, int]:
    """Maps (all and outermost, i.e. kernels), tasklets, library nodes and transients of an SDFG."""
    if sdfg is None:
        return {}
    result = {"maps": 0, "kernels": 0, "tasklets": 0, "library_nodes": 0}
    for node, parent in sdfg.all_nodes_recursive():
        if isinstance(node, nodes.MapEntry):
            result["maps"] += 1
            if parent.entry_node(node) is None and isinstance(parent, dace.SDFGState) and parent.sdfg is sdfg:
                result["kernels"] += 1
        elif isinstance(node, nodes.Tasklet):
            result["tasklets"] += 1
        elif isinstance(node, nodes.LibraryNode):
            result["library_nodes"] += 1
    result["transients"] = sum(
        1 for s in sdfg.all_sdfgs_recursive() for d in s.arrays.values() if d.transient and not isinstance(d, dt.View)
    )
    return result


def _nbytes(desc: dt.Data) -> int:
    return int(desc.total_size) * desc.dtype.bytes
