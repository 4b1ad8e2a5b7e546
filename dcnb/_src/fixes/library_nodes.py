"""What dcnb's own library nodes share: ops whose code depends on where they run (C++ loops on the CPU, a GPU
library's call from the host in a CUDA build), so that the choice is made when the node expands, at code
generation, when the build's passes have placed it (``registry.on_gpu_host``)."""

from __future__ import annotations

import re

import dace
from dace import data as dt
from dace.sdfg import nodes

from .. import gpu_libs
from .registry import on_gpu_host


def backward_node(nested: nodes.NestedSDFG, node: nodes.LibraryNode, inputs: list[str], outputs: list[str]) -> None:
    """Fill ``nested``, a backward rule's node, with ``node`` over the whole arrays ``inputs`` and ``outputs``, each
    connected to the connector of its name; never inlined, as the C++ loops it held before were not (``cpp.py``):
    inlined, ``node`` met the views around it (an average pooling's gradient read a view DaCe then found
    ambiguous)."""
    nested.no_inline = True
    sdfg = nested.sdfg
    state = sdfg.add_state()
    state.add_node(node)
    for name in inputs:
        node.add_in_connector(name)
        state.add_edge(state.add_read(name), None, node, name, dace.Memlet.from_array(name, sdfg.arrays[name]))
    for name in outputs:
        node.add_out_connector(name)
        state.add_edge(node, name, state.add_write(name), None, dace.Memlet.from_array(name, sdfg.arrays[name]))


def connected(node: nodes.LibraryNode, state, sdfg) -> dict[str, dt.Data]:
    """The arrays ``node``'s connectors reach, by connector."""
    found = {e.dst_conn: sdfg.arrays[e.data.data] for e in state.in_edges(node)}
    return found | {e.src_conn: sdfg.arrays[e.data.data] for e in state.out_edges(node)}


def concrete(desc: dt.Data) -> bool:
    """Whether ``desc``'s shape and strides are numbers (what a library's descriptors are made of)."""
    return all(str(v).lstrip("-").isdigit() for v in (*desc.shape, *desc.strides))


def library_call(
    node: nodes.LibraryNode, state, sdfg, kind: str, field_type: str, create: str, call: str
) -> nodes.Tasklet:
    """A host tasklet for ``node`` calling a GPU library: ``create`` (C++ over ``FIELD``, the node's own state
    field of ``field_type``, and ``__state``) runs when the binary is loaded, ``call`` (the same, and the node's
    connectors as pointers, by their names) on every call, on the stream of the binary's kernels
    (``__dace_current_stream``); both are expressions that are true where they succeeded."""
    field = f"__state->{gpu_libs.field_name(kind, sdfg)}"
    return pointer_tasklet(
        node,
        state,
        sdfg,
        call,
        lambda call: f"if (!({call.replace('FIELD', field)})) {{\n{gpu_libs.FAILED}\n}}",
        state_fields=[f"{field_type} {field.removeprefix('__state->')};"],
        code_init=f"__result |= !({create.replace('FIELD', field)});",
        code_exit=f"{field}.destroy();",
    )


def pointer_tasklet(
    node: nodes.LibraryNode, state, sdfg, call: str, wrap=lambda call: call, **options
) -> nodes.Tasklet:
    """A C++ tasklet in place of ``node`` running ``wrap(call)``, where ``call`` reaches each of the node's
    connectors as a pointer by its name; ``options`` go to the tasklet."""
    arrays = connected(node, state, sdfg)
    # a tasklet's connector may not share a name with an array of the SDFG (an inlined expansion's X or Y): the
    # node's connectors, which its edges keep as they move to the tasklet, get names of their own
    for edge in state.in_edges(node):
        edge.dst_conn = _own(edge.dst_conn)
    for edge in state.out_edges(node):
        edge.src_conn = _own(edge.src_conn)
    for name in arrays:
        call = re.sub(rf"\b{name}\b", _own(name), call)
    pointers = lambda names: {_own(n): dace.pointer(arrays[n].dtype) for n in names}  # one element too
    return nodes.Tasklet(
        node.label,
        pointers(node.in_connectors),
        pointers(node.out_connectors),
        wrap(call),
        language=dace.Language.CPP,
        **options,
    )


def _own(connector: str) -> str:
    return f"__dcnb_{connector}"


def cudnn_type(desc: dt.Data) -> str:
    return "CUDNN_DATA_DOUBLE" if desc.dtype == dace.float64 else "CUDNN_DATA_FLOAT"


def shape(desc: dt.Data) -> str:
    """C++ for a ``dcnb_gpu::Shape`` of ``desc``'s dimensions and strides."""
    return f"dcnb_gpu::Shape({gpu_libs.dims(desc.shape)}, {gpu_libs.dims(desc.strides)})"


def loops_on_gpu(node: nodes.LibraryNode, state, sdfg, nested: dace.SDFG) -> dace.SDFG:
    """``nested``, the loops ``node`` expanded to, as GPU code where the build placed ``node`` on the GPU: expanded
    at code generation, after the build turned host code into kernels, its tasklets would run on the host over GPU
    memory. Its tasklets become kernels (one thread each, as the build made them before), its temporaries GPU
    memory, as the build does for the whole SDFG."""
    if not on_gpu_host(node, state, sdfg):
        return nested
    nested.apply_gpu_transformations(simplify=False)
    node.schedule = dace.ScheduleType.Default  # the nested SDFG is called from the host; its kernels are inside
    return nested
