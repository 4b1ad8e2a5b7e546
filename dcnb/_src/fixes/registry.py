"""Registering dcnb's expansions and backward rules with DaCe's ONNX library, over every version of an op."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable

import dace
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.libraries.onnx.nodes.onnx_op import ONNXOp
from dace.libraries.onnx.nodes.onnx_op_registry import get_onnx_node
from dace.sdfg import nodes
from dace.sdfg.scope import is_devicelevel_gpu
from dace.transformation.transformation import ExpandTransformation

from ..frontend import OPSET
from ..names import readable
from .cpp import kept_nested


def op_versions(op: str) -> list[type[ONNXOp]]:
    """The classes DaCe generated for an ONNX op: one per version of its schema up to our export's opset, and the
    newest, which DaCe's own rules instantiate."""
    versions = []
    for version in [*range(1, OPSET + 1), -1]:
        try:
            cls = get_onnx_node(op, version)
        except ValueError:
            continue
        if cls not in versions:
            versions.append(cls)
    return versions


def pure_expansion(op: str, name: str = "pure"):
    """Register an ONNXForward class as the expansion of ``op`` that DaCe's ONNX library expands to by default:
    as "pure" where DaCe has none, else under ``name``, made the op's default.

    DaCe's own ``@op_implementation`` only takes effect before its op registry is first built, which importing
    the ONNX importer already does, so the expansion is attached to the generated op classes directly.
    """

    def register(impl: type[ONNXForward]) -> type[ONNXForward]:
        for cls in op_versions(op):
            class_name = f"{cls.__name__}_Expansion_dcnb"
            expansion = type(
                class_name,
                (ExpandTransformation,),
                {
                    "environments": [],
                    "forward_impl": impl,  # as DaCe's own expansions name it
                    "expansion": staticmethod(functools.partial(_expand, op, impl)),
                    "postprocessing": staticmethod(lambda sdfg, state, nested: kept_nested(nested)),
                },
            )
            globals()[class_name] = expansion  # where DaCe looks for it when it loads an SDFG that names it
            cls.register_implementation(name, expansion)
            if name != "pure":
                cls.default_implementation = name
        return impl

    return register


def _expand(op: str, impl: type[ONNXForward], node: ONNXOp, state, sdfg, *args, **kwargs):
    if not impl.forward_can_be_applied(node, state, sdfg):
        raise NotImplementedError(
            f"the ONNX op {op} of {readable(node.label)} uses attributes dcnb's expansion does not cover"
        )
    return impl.forward(node, state, sdfg)


def default_backward(op: str, name: str = "dcnb") -> None:
    """Make the backward rule registered as ``name`` the one autodiff picks for ``op`` where it applies."""
    for cls in op_versions(op):
        cls.default_backward_implementation = name


#: the implementation dcnb registers on DaCe's own library nodes (BLAS, Reduce) and puts first: it picks one
CHOOSE = "dcnb"


def choice(pick: Callable[..., str]):
    """The ``expansion`` of an implementation that chooses another: the node comes back as a copy naming the
    implementation ``pick(node, state, sdfg)`` returns, which DaCe then expands in turn (as it does the Gemm that
    its MatMul's "specialize" returns)."""

    def expansion(node, state, sdfg):
        chosen = copy.deepcopy(node)
        chosen.implementation = pick(node, state, sdfg)
        return chosen

    return staticmethod(expansion)


def _in_gpu_code(node, state, sdfg) -> bool:
    """DaCe's ``is_devicelevel_gpu``, asked only where a scope of a GPU schedule sits in the node's state or in a
    state its SDFG is nested in: without one, the node is in no GPU code.

    gap: DaCe's answer reads the state's scope dictionary, which the expansion before discarded: a walk of the whole
    state per library node picked or expanded (19 of auto_optimize's 310 s, profiled, on a 12-layer BERT's backward).
    """
    around, nested = state, sdfg
    while around is not None:
        if any(isinstance(n, nodes.EntryNode) and n.schedule in dace.dtypes.GPU_SCHEDULES for n in around.nodes()):
            return is_devicelevel_gpu(sdfg, state, node)
        around, nested = nested.parent, nested.parent_sdfg
    return False


def on_cpu(node, state, sdfg) -> bool:
    """Whether ``node`` runs on the CPU (no GPU schedule, not inside GPU code) over memory the CPU reads."""
    if node.schedule in dace.dtypes.GPU_SCHEDULES or _in_gpu_code(node, state, sdfg):
        return False
    descs = [sdfg.arrays[e.data.data] for e in (*state.in_edges(node), *state.out_edges(node))]
    return all(dace.dtypes.can_access(dace.ScheduleType.CPU_Multicore, d.storage) for d in descs)


def on_gpu_host(node, state, sdfg) -> bool:
    """Whether ``node`` is called from the host (outside kernels) over GPU memory only: where a CUDA build calls a
    GPU library (cuBLAS, cuDNN) for it, on the stream its kernels run on."""
    if _in_gpu_code(node, state, sdfg):
        return False
    descs = [sdfg.arrays[e.data.data] for e in (*state.in_edges(node), *state.out_edges(node))]
    return bool(descs) and all(d.storage == dace.StorageType.GPU_Global for d in descs)
