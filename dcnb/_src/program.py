"""A forward SDFG before autodiff -> the forward and backward SDFGs that run (a Program)."""

from __future__ import annotations

import copy
import dataclasses
import types

import dace
from dace import data as dt
from dace.autodiff import AutoDiffException
from dace.autodiff.torch import make_backward_function
from dace.sdfg import nodes

from . import passes
from .errors import StepError, describe
from .frontend import Imported
from .passes import after_autodiff
from .names import readable, readable_text


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
    passes.run(passes.BEFORE_AUTODIFF, forward)
    # gap: DaCe's autodiff fails (KeyError) on an input no output depends on; its gradient is PyTorch's zeros,
    # which the check accepts for a missing one (LeViT's queries of a single query token reach only BatchNorm's
    # running statistics)
    feeding = _feeding(forward, imported.outputs)
    wrt = [name for name in wrt if name in feeding]
    if not wrt:
        raise StepError("no input or parameter requiring a gradient reaches an output: build it with backward=False")
    model = types.SimpleNamespace(sdfg=forward, outputs=imported.outputs)
    try:
        forward, backward, result, forwarded = make_backward_function(model, wrt)
    except AutoDiffException as e:
        raise StepError(f"DaCe's autodiff failed: {readable_text(str(e))}") from e
    except AssertionError as e:
        # DaCe 2.0.0b1's autodiff asserts when the backward needs a value computed inside a map scope
        inner = _in_scope_intermediates(pre)
        if inner:
            named = sorted(readable(name) for name in inner)[:3]
            raise StepError(
                f"DaCe's autodiff cannot store values computed inside a map for the backward ({', '.join(named)}); "
                "fuse maps after autodiff (map_fusion) or merge the tasklets before it (tasklet_fusion)"
            ) from e
        raise StepError("DaCe's autodiff failed on an internal assertion") from e
    except Exception as e:  # an SDFG it made and found invalid, say
        raise StepError(f"DaCe's autodiff failed: {describe(e)}") from e
    forwarded = after_autodiff.constants_passed_again(forward, backward, list(forwarded), imported.constants)
    passes.run(passes.AFTER_AUTODIFF, forward, "forward")
    passes.run(passes.AFTER_AUTODIFF, backward, "backward")
    return Program(
        forward=forward,
        backward=backward,
        forwarded=forwarded,
        input_grads=dict(result.required_grad_names),
        output_grads=dict(result.given_grad_names),
    )


def _feeding(sdfg: dace.SDFG, outputs: list[str]) -> set[str]:
    """The arrays of ``sdfg``'s one state that some array in ``outputs`` is computed from (them included)."""
    state = sdfg.start_state
    by_name: dict[str, list[nodes.AccessNode]] = {}
    for node in state.data_nodes():
        by_name.setdefault(node.data, []).append(node)
    found, frontier = set(outputs), [n for name in outputs for n in by_name.get(name, [])]
    seen = set(frontier)
    while frontier:
        for edge in state.in_edges(frontier.pop()):
            if edge.src in seen:
                continue
            # every access node of an array it reaches: one written in one place may be read from another
            reached = by_name[edge.src.data] if isinstance(edge.src, nodes.AccessNode) else [edge.src]
            for node in reached:
                if node not in seen:
                    seen.add(node)
                    frontier.append(node)
            if isinstance(edge.src, nodes.AccessNode):
                found.add(edge.src.data)
    return found


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
