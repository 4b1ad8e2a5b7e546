"""The CUDA build: arguments in GPU memory, every map and library node in a kernel, kernels sized."""

from __future__ import annotations

from collections.abc import Iterator

import dace
from dace import data as dt
from dace.frontend.operations import detect_reduction_type
from dace.libraries.standard import Reduce
from dace.libraries.standard.reduction_planner import get_reduction_schedule
from dace.sdfg import nodes
from dace.sdfg.scope import is_devicelevel_gpu
from dace.sdfg.utils import get_view_edge
from dace.transformation.onnx.optimize import expand_onnx_nodes

from ..fixes import reduce_node
from .simplify import simplify


def to_gpu(sdfg: dace.SDFG) -> int:
    """Place arguments in GPU memory and turn every outermost host map and library node into GPU code; returns the
    nodes moved. None where the gpu step moved them already; after auto_optimize for a GPU, which placed the
    arguments and ran DaCe's GPU transformation, what it left on the host (autodiff's accumulating copies, maps it
    made sequential) is moved as before."""
    if on_gpu(sdfg) and not _left_on_host(sdfg):
        return 0
    moved = len(host_nodes(sdfg))
    # ONNX nodes expanded first, so that their maps become kernels with the rest: expanded inside a GPU schedule,
    # DaCe passed scalars of their nested SDFGs to kernels as values where pointers were needed (LayerNorm's
    # backward did not compile)
    expand_onnx_nodes(sdfg)
    simplify(sdfg)
    accumulating_copies_to_maps(sdfg)
    arguments_in_gpu_memory(sdfg)
    sdfg.apply_gpu_transformations(simplify=False)
    simplify(sdfg)
    gpu_scalars_as_arrays(sdfg)
    const_pointer_reads(sdfg)
    return moved


def _left_on_host(sdfg: dace.SDFG) -> bool:
    """Whether an outermost map or library node of ``sdfg`` runs on the host, outside GPU code, or a copy adds into
    an array (which DaCe's CUDA code generator has none of)."""
    if next(_accumulating_copies(sdfg), None) is not None:
        return True
    return any(not is_devicelevel_gpu(state.sdfg, state, n) for n, state in _outermost_without_gpu_schedule(sdfg))


def arguments_in_gpu_memory(sdfg: dace.SDFG) -> None:
    """Place the SDFG's arguments in GPU memory, where dcnb's calls pass them, before DaCe's GPU transformation: else
    it gives each a copy of its own there, copied in and out on every call (84 copies per call of a BERT-base layer
    after auto_optimize, which runs it, on an H200: 278 us of its 2.3 ms of kernels)."""
    for desc in sdfg.arrays.values():
        if not desc.transient and not isinstance(desc, dt.Scalar):
            desc.storage = dace.StorageType.GPU_Global


def gpu_scalars_as_arrays(sdfg: dace.SDFG) -> None:
    """Scalars in GPU memory as arrays of one element: those stored there, and a nested SDFG's scalar argument whose
    outer data is there (a loss's gradient), outermost first.

    gap: DaCe's code generator passes such a scalar to a nested SDFG's function as a host reference
    (``const float&``) while the kernels inside take its device pointer: the MLP's and the loss's backward did not
    compile for CUDA ("cannot convert 'const float' to 'const float*'")."""
    made: set[tuple[int, str]] = set()  # (nested SDFG, argument) turned into arrays
    for nested in sdfg.all_sdfgs_recursive():
        for name, desc in list(nested.arrays.items()):
            if isinstance(desc, dt.Scalar) and desc.storage == dace.StorageType.GPU_Global:
                nested.arrays[name] = _one_element(desc, desc.transient)
                made.add((id(nested), name))
        for node, state in nested.all_nodes_recursive():
            if not isinstance(node, nodes.NestedSDFG):
                continue
            for edge in (*state.in_edges(node), *state.out_edges(node)):
                name = edge.dst_conn if edge.dst is node else edge.src_conn
                inner = node.sdfg.arrays.get(name)
                outer = state.sdfg.arrays[edge.data.data] if edge.data.data else None
                if isinstance(inner, dt.Scalar) and outer is not None and outer.storage == dace.StorageType.GPU_Global:
                    node.sdfg.arrays[name] = _one_element(inner, False)
                    made.add((id(node.sdfg), name))
    for node, _ in sdfg.all_nodes_recursive():
        if isinstance(node, nodes.NestedSDFG):
            for name in (*node.in_connectors, *node.out_connectors):
                if (id(node.sdfg), name) in made:
                    _pointer_connector(node, name)


def _pointer_connector(node: nodes.NestedSDFG, name: str) -> None:
    """The nested SDFG's connector ``name``, an array now, typed as its pointer where a type was inferred before.

    gap: DaCe keeps a connector type inferred once (auto_optimize infers them) and declares the argument by it: the
    MLP's backward after auto_optimize passed the loss's gradient on as ``const float&`` to a kernel taking its
    pointer ("cannot convert 'const float' to 'const float*'")."""
    for connectors in (node.in_connectors, node.out_connectors):
        ctype = connectors.get(name)
        if ctype is not None and ctype.type is not None and not isinstance(ctype, dace.pointer):
            connectors[name] = dace.pointer(node.sdfg.arrays[name].dtype)


def const_pointer_reads(sdfg: dace.SDFG) -> None:
    """A tasklet in a kernel that reads an array through a pointer reads it through a const one.

    gap: DaCe declares such a connector a plain pointer (``bool* __data = &input_0[0]``) while the kernel receives
    the data it only reads as ``const``: BERT's token type lookup (a Gather) did not compile for CUDA ("'const bool
    *' cannot initialize 'bool *'"). Where a read may touch any element, DaCe declares the pointer const."""
    for node, state in sdfg.all_nodes_recursive():
        if not isinstance(node, nodes.Tasklet) or not is_devicelevel_gpu(state.sdfg, state, node):
            continue
        for edge in state.in_edges(node):
            if isinstance(node.in_connectors.get(edge.dst_conn), dace.pointer) and edge.dst_conn not in node.out_connectors:
                edge.data.dynamic = True


def _one_element(desc: dt.Scalar, transient: bool) -> dt.Array:
    return dt.Array(
        desc.dtype, [1], transient=transient, storage=dace.StorageType.GPU_Global, lifetime=desc.lifetime
    )


def plannable_reductions(sdfg: dace.SDFG) -> int:
    """A reduction set to DaCe's GPUAuto expansion (auto_optimize's choice on a GPU) that it cannot plan or
    generate takes the one a GPU gets without it (``reduce_node.on_gpu``: a loop per output element, or a map whose
    writes reduce); returns how many.

    gap: GPUAuto leaves the reduced axes of length one out and then plans with the first of those left: ConvNet's
    BatchNorm backward after auto_optimize (a variance's gradient summed over its 1x1 broadcast) did not generate
    ("list index out of range"). And where it loads vectors it reduces them with the reduction's C++ operator,
    which CUDA's float4 has for sums only: a max over rows (softmax's) did not compile ("no operator ">" matches")."""
    turned = 0
    for node, state in sdfg.all_nodes_recursive():
        if not (isinstance(node, Reduce) and node.implementation == "GPUAuto"):
            continue
        edge = state.in_edges(node)[0]
        subset = edge.data.subset
        axes = range(subset.dims()) if node.axes is None else node.axes
        left = [a for a in axes if subset.size()[a] != 1]
        is_sum = detect_reduction_type(node.wcr) == dace.dtypes.ReductionType.Sum
        if not left or not is_sum and get_reduction_schedule(state.sdfg.arrays[edge.data.data], left).vectorize:
            node.implementation = reduce_node.on_gpu(node, state)
            turned += 1
    return turned


#: threads per block where a kernel gives none: enough warps per block to hide memory latency
THREADS_PER_BLOCK = 256


def size_blocks(sdfg: dace.SDFG) -> None:
    """Give each CUDA kernel without a block size one shaped to its map: DaCe's default of one warp per block
    leaves the GPU's memory latency exposed (benchmarks/NOTES.md, GPU)."""
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


def no_state_syncs(sdfg: dace.SDFG) -> None:
    """No host wait at the end of each state: on the one stream PyTorch's work and the call's run in order, the
    host reads no GPU memory between states, and a wait would forbid capturing a call into a CUDA graph.

    gap: DaCe's CUDA code generator ends every host state with a stream synchronization unless the state says
    ``nosync``; copies the host itself reads still synchronize."""
    for nested in sdfg.all_sdfgs_recursive():
        for state in nested.states():
            state.nosync = True


def host_nodes(sdfg: dace.SDFG) -> list[nodes.MapEntry | nodes.LibraryNode]:
    """Outermost maps and library nodes (softmax, matmul, ...) that would run on the host."""
    return [n for n, _ in _outermost_without_gpu_schedule(sdfg)]


def _outermost_without_gpu_schedule(sdfg: dace.SDFG) -> Iterator[tuple[nodes.Node, dace.SDFGState]]:
    """(node, state) of each map and library node outermost in its state and of no GPU schedule (one in a nested
    SDFG may still be inside a kernel around that SDFG)."""
    for n, state in sdfg.all_nodes_recursive():
        if (
            isinstance(n, (nodes.MapEntry, nodes.LibraryNode))
            and state.entry_node(n) is None
            and n.schedule not in dace.dtypes.GPU_SCHEDULES
        ):
            yield n, state


def on_gpu(sdfg: dace.SDFG) -> bool:
    """Whether the SDFG's arguments live in GPU memory already (the gpu step ran)."""
    return all(
        desc.storage == dace.StorageType.GPU_Global
        for desc in sdfg.arrays.values()
        if not desc.transient and not isinstance(desc, dt.Scalar)
    )


def accumulating_copies_to_maps(sdfg: dace.SDFG) -> int:
    """Turn copies that add into an array (outside maps) into maps that add element by element; returns how many.

    gap: DaCe's CUDA code generator emits no copy that adds into GPU memory ("Accumulate Device to Device not
    implemented"), and autodiff adds a gradient's contributions with such copies (MLP and attention backward).
    """
    turned = 0
    for state, edge, src_subset, dst_subset, sizes in _accumulating_copies(sdfg):
        src, dst = edge.src, edge.dst
        params = [f"__c{i}" for i in range(len(sizes))]
        state.add_mapped_tasklet(
            f"accumulate_{dst.data}",
            {p: f"0:{s}" for p, s in zip(params, sizes)} or {"__c": "0:1"},
            {"__in": dace.Memlet(f"{src.data}[{_moved_index(src_subset, params)}]")},
            "__out = __in",
            {"__out": dace.Memlet(f"{dst.data}[{_moved_index(dst_subset, params)}]", wcr=edge.data.wcr)},
            external_edges=True,
            input_nodes={src.data: src},
            output_nodes={dst.data: dst},
        )
        state.remove_edge(edge)
        turned += 1
    return turned


def _accumulating_copies(sdfg: dace.SDFG) -> Iterator[tuple]:
    """(state, edge, source subset, destination subset, the sizes they share) of each copy outside maps that adds
    into an array, its source and destination of the same elements."""
    for state in (s for g in sdfg.all_sdfgs_recursive() for s in g.states()):
        for edge in list(state.edges()):
            src, dst, memlet = edge.src, edge.dst, edge.data
            if not (isinstance(src, nodes.AccessNode) and isinstance(dst, nodes.AccessNode)) or memlet.wcr is None:
                continue
            arrays = state.sdfg.arrays
            if state.entry_node(src) is not None or any(
                isinstance(arrays[n.data], dt.View) and get_view_edge(state, n) is edge for n in (src, dst)
            ):
                continue  # inside a kernel, or a view's own edge (which a map would leave viewing nothing)
            # the memlet's subset is its data's side of the copy; the other side, where not given, is a whole array
            ours, other = memlet.subset, memlet.other_subset
            dst_subset, src_subset = (ours, other) if memlet.data == dst.data else (other, ours)
            dst_subset = dst_subset or dace.subsets.Range.from_array(arrays[dst.data])
            src_subset = src_subset or dace.subsets.Range.from_array(arrays[src.data])
            sizes = [s for s in dst_subset.size() if s != 1]
            if [s for s in src_subset.size() if s != 1] != sizes:
                continue  # a reshaping copy: left to DaCe
            yield state, edge, src_subset, dst_subset, sizes


def _moved_index(subset: dace.subsets.Range, params: list[str]) -> str:
    """An element of ``subset`` as an index: its dimensions longer than one moved by ``params``, in order."""
    moving = iter(params)
    return ", ".join(
        str(begin) if size == 1 else f"{begin} + ({step}) * {next(moving)}"
        for (begin, _, step), size in zip(subset.ndrange(), subset.size())
    )
