"""The transformations a session offers, as data: a registry of named Actions.

An action acts either before autodiff (on the forward SDFG, after which the backward is regenerated, so that
autodiff differentiates the transformed code: DaCeML's tasklet-fusion trick) or after it (on the forward and
backward SDFGs alike). ``where`` restricts an action to matches touching the named nodes (node labels, as the
graph views show them: map, tasklet, library-node labels, or array names for access nodes).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import warnings
from collections.abc import Callable, Collection

import dace
from dace.libraries.onnx.nodes.onnx_op import ONNXOp
from dace.sdfg import nodes
from dace.sdfg.state import StateSubgraphView
from dace.transformation import PatternTransformation
from dace.transformation.auto.auto_optimize import auto_optimize
from dace.transformation.dataflow import (
    MapFusion,
    TaskletFusion,
    TrivialMapElimination,
    Vectorization,
)
from dace.transformation.onnx.optimize import expand_onnx_nodes
from dace.transformation.optimizer import Optimizer
from dace.transformation.subgraph import SubgraphFusion

from . import algebra, opfixes, program, rows, vecmath
from .errors import check

Where = Collection[str] | None


@dataclasses.dataclass(frozen=True)
class Action:
    """A named transformation: how many places it matches in an SDFG, and how to apply it there."""

    name: str
    description: str
    #: True: acts on the forward SDFG before autodiff; False: on both SDFGs after it
    before_autodiff: bool
    count: Callable[[dace.SDFG, Where, dict], int]
    #: run(sdfg, where, options, device) -> places applied
    run: Callable[[dace.SDFG, Where, dict, str], int]
    #: devices ("cpu", "cuda") the action is offered on
    devices: tuple[str, ...] = ("cpu", "cuda")
    #: why_not(sdfg, where, options) -> reasons the action left candidate places alone (for "matches nothing")
    why_not: Callable[[dace.SDFG, Where, dict], list[str]] | None = None


@dataclasses.dataclass(frozen=True)
class Offer:
    """An action as offered now: its description and how many places it matches."""

    name: str
    description: str
    before_autodiff: bool
    matches: int

    @property
    def phase(self) -> str:
        return "before autodiff" if self.before_autodiff else "after autodiff"


REGISTRY: dict[str, Action] = {}


def register(action: Action) -> Action:
    REGISTRY[action.name] = action
    return action


def get(name: str) -> Action:
    if name not in REGISTRY:
        raise KeyError(f"unknown action {name!r}; the actions are: {', '.join(REGISTRY)}")
    return REGISTRY[name]


# --- pattern transformations, one match at a time so that `where` can filter ---------------------------------


def _label(node: nodes.Node) -> str:
    if isinstance(node, nodes.AccessNode):
        return node.data
    if isinstance(node, (nodes.MapEntry, nodes.MapExit)):
        return node.map.label
    return getattr(node, "label", str(node))


def _touches(match: PatternTransformation, sdfg: dace.SDFG, where: Where) -> bool:
    if where is None:
        return True
    matched = [getattr(match, name) for name in type(match)._get_pattern_nodes()]
    return any(_label(n) in where for n in matched)


def _matches(xform: type[PatternTransformation], sdfg: dace.SDFG, where: Where, options: dict):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for match in Optimizer(sdfg).get_pattern_matches(patterns=[xform], options=[options] if options else None):
            if _touches(match, sdfg, where):
                yield match


def _count(xform: type[PatternTransformation]) -> Callable[[dace.SDFG, Where, dict], int]:
    return lambda sdfg, where, options: sum(1 for _ in _matches(xform, sdfg, where, options))


def _repeat(xform: type[PatternTransformation]) -> Callable[[dace.SDFG, Where, dict, str], int]:
    def run(sdfg: dace.SDFG, where: Where, options: dict, device: str = "cpu") -> int:
        applied = 0
        while (match := next(_matches(xform, sdfg, where, options), None)) is not None:
            match.apply_pattern(append=False)
            applied += 1
        return applied

    return run


# --- expand ---------------------------------------------------------------------------------------------------


def _onnx_nodes(sdfg: dace.SDFG, where: Where) -> list[ONNXOp]:
    return [n for n, _ in sdfg.all_nodes_recursive() if isinstance(n, ONNXOp) and (where is None or n.label in where)]


def _expand(sdfg: dace.SDFG, where: Where, options: dict, device: str) -> int:
    targets = _onnx_nodes(sdfg, where)
    expand_onnx_nodes(sdfg, predicate=lambda n: where is None or n.label in where)
    sdfg.simplify()
    return len(targets)


register(
    Action(
        "expand",
        "Expand ONNX library nodes (matmul, softmax, norms, ...) to their pure maps and tasklets in the forward "
        "and the backward, so that fusion can reach inside them.",
        # after autodiff: before it, the expanded code replaced the nodes' backward rules, and DaCe's autodiff
        # fails on many expansions (softmax's max reduction, layer norm's views, C++ loops)
        before_autodiff=False,
        count=lambda sdfg, where, options: len(_onnx_nodes(sdfg, where)),
        run=_expand,
    )
)

register(
    Action(
        "map_fusion",
        "Fuse each producer map into its consumer map (in the forward and the backward), so that intermediates "
        "pass through registers; those the backward needs are still stored.",
        before_autodiff=False,
        count=_count(MapFusion),
        run=_repeat(MapFusion),
    )
)


# --- subgraph fusion --------------------------------------------------------------------------------------------


def _fusable(sdfg: dace.SDFG, where: Where) -> list[StateSubgraphView]:
    groups = []
    for state in sdfg.states():
        top = [n for n in state.nodes() if state.entry_node(n) is None]
        if where is not None:
            top = [n for n in top if _label(n) in where or isinstance(n, nodes.AccessNode)]
        maps = [n for n in top if isinstance(n, nodes.MapEntry)]
        if len(maps) < 2:
            continue
        subgraph = StateSubgraphView(state, _with_scopes(state, top))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if SubgraphFusion.can_be_applied_to(sdfg, subgraph):
                groups.append(subgraph)
    return groups


def _with_scopes(state: dace.SDFGState, top: list[nodes.Node]) -> list[nodes.Node]:
    result = []
    for node in top:
        result.append(node)
        if isinstance(node, nodes.MapEntry):
            result.extend(state.scope_subgraph(node, include_entry=False, include_exit=True).nodes())
    return result


def _subgraph_fusion(sdfg: dace.SDFG, where: Where, options: dict, device: str) -> int:
    sdfg.apply_transformations_repeated(TrivialMapElimination)
    groups = _fusable(sdfg, where)
    check(groups, "subgraph_fusion finds no group of maps it can fuse")
    for subgraph in groups:
        SubgraphFusion.apply_to(sdfg, subgraph.nodes(), **options)
    return len(groups)


register(
    Action(
        "subgraph_fusion",
        "Fuse all maps of a state (or the selected ones) into one map, in the forward and the backward.",
        before_autodiff=False,
        count=lambda sdfg, where, options: len(_fusable(sdfg, where)),
        run=_subgraph_fusion,
    )
)

def _fused_copy(sdfg: dace.SDFG, where: Where) -> dace.SDFG:
    fused = copy.deepcopy(sdfg)
    _repeat(MapFusion)(fused, where, {})
    return fused


def _tasklet_fusion(sdfg: dace.SDFG, where: Where, options: dict, device: str) -> int:
    # TaskletFusion merges tasklets within one scope, so maps are fused first; that intermediate never
    # reaches autodiff, which cannot forward values computed inside a map (see program.differentiate)
    _repeat(MapFusion)(sdfg, where, {})
    return _repeat(TaskletFusion)(sdfg, where, options)


register(
    Action(
        "tasklet_fusion",
        "Fuse maps and merge their chains of tasklets into one expression before autodiff: the backward then "
        "recomputes the intermediates instead of storing them.",
        before_autodiff=True,
        count=lambda sdfg, where, options: _count(TaskletFusion)(_fused_copy(sdfg, where), where, options),
        run=_tasklet_fusion,
    )
)


# --- vectorization ----------------------------------------------------------------------------------------------


def _vector_widths(options: dict) -> list[int]:
    """Widths to try, widest first: the one asked for, else the native width and its halves down to 4."""
    if "vector_len" in options:
        return [int(options["vector_len"])]
    native = vecmath.native_width()
    return [w for w in (native, native // 2, native // 4) if w >= 4]


def _vectorizable(sdfg: dace.SDFG, where: Where, options: dict):
    """A match for each map that can be vectorized whole, with the widest width that fits it."""
    widths = _vector_widths(options)
    seen = set()
    for width in widths:
        for match in _matches(Vectorization, sdfg, where, {"vector_len": width}):
            if id(match.map_entry) not in seen and _fits(match, width) and _vector_safe(match, width):
                seen.add(id(match.map_entry))
                yield match


def _fits(match: Vectorization, width: int) -> bool:
    # DaCe's Vectorization moves a remainder into a scalar "postamble" map, which matches again (a map shorter
    # than one vector would be split forever), and its code loads vectors through aligned vector pointers (a row
    # whose length is no multiple of the width crashes). So: whole vectors only, in every row of every array.
    first, last, step = match.map_entry.map.range[-1]
    extent = last - first + 1
    if not all(getattr(v, "is_Integer", isinstance(v, int)) for v in (first, extent, step)):
        return False
    if int(step) != 1 or int(first) % width or int(extent) % width:
        return False
    state = match._sdfg.cfg_list[match.cfg_id].node(match.state_id)
    tasklet = state.successors(match.map_entry)[0]
    for edge in state.all_edges(tasklet):
        if edge.data.data is None:
            continue
        desc = state.sdfg.arrays[edge.data.data]
        for stride in (*desc.strides[:-1], desc.start_offset):
            if not getattr(stride, "is_Integer", isinstance(stride, int)) or int(stride) % width:
                return False
    return True


def _vector_safe(match: PatternTransformation, width: int) -> bool:
    """Whether DaCe's Vectorization, applied to a match that ``_fits``, gives code that compiles and computes the
    same.

    Every vector must start at a multiple of the width inside its row (an access at ``i + 1`` is not aligned).
    GCC's vectors do not convert to or from scalars in an assignment, so every output must be a vector and some
    input too, and no output may add a vector into one element (a reduction); and only functions with vector
    versions that compute what the scalar ones do may be called.
    """
    try:
        return _vector_code_is_right(match, width)
    except TypeError:  # a symbolic range or stride: nothing to prove the conditions with
        return False


def _vector_code_is_right(match: PatternTransformation, width: int) -> bool:
    state = match._sdfg.cfg_list[match.cfg_id].node(match.state_id)
    entry = match.map_entry
    param = entry.map.params[-1]
    tasklet = state.successors(entry)[0]
    if tasklet.code.language != dace.Language.Python or _calls(tasklet.code.code) - VECTOR_FUNCTIONS:
        return False
    vector_inputs, types = 0, set()
    for edge in state.all_edges(tasklet):
        if edge.data.data is None:
            continue
        subset = edge.data.subset
        if param not in {str(symbol) for symbol in subset.free_symbols}:
            if edge.src is tasklet:
                return False  # a scalar output, or one element a whole vector is added into
            continue  # an input read as a scalar, which GCC broadcasts in arithmetic
        vector_inputs += edge.dst is tasklet
        desc = state.sdfg.arrays[edge.data.data]
        types.add(desc.dtype)
        for (first, _, _), stride in zip(subset.ndrange(), desc.strides):
            if int(stride) == 1:
                offset = dace.symbolic.pystr_to_symbolic(str(first)) - dace.symbolic.pystr_to_symbolic(param)
                if offset.free_symbols or int(offset) % width:
                    return False
            elif int(stride) % width:
                return False
    return vector_inputs > 0 and len(types) == 1  # GCC does not convert vectors of floats to doubles


#: functions with vector versions that compute what the scalar ones do (DaCe's runtime and vecmath.h); DaCe's
#: ``heaviside`` compiles for vectors but returns the comparison's bits reinterpreted as floats
VECTOR_FUNCTIONS = {
    "exp", "exp2", "expm1", "log", "log1p", "log2", "tanh", "sinh", "cosh", "sin", "cos", "atan", "erf", "erfc",
    "sqrt", "abs", "fabs", "floor", "ceil", "round", "min", "max", "fmin", "fmax", "pow", "ipow",
}


def _calls(code: list) -> set[str]:
    """Names of the functions a Python tasklet calls, casts to DaCe types (``dace.float32(1)``) left out."""
    names = set()
    for node in (n for statement in code for n in ast.walk(statement)):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "dace":
                continue
            names.add(func.id if isinstance(func, ast.Name) else ast.unparse(func))
    return names


def _vectorize(sdfg: dace.SDFG, where: Where, options: dict, device: str) -> int:
    # the vector overloads of the math functions come with every CPU build (build.py installs vecmath.h); the
    # runner passes 64-byte aligned arrays (module.py)
    applied = 0
    while (match := next(_vectorizable(sdfg, where, options), None)) is not None:
        match.apply_pattern(append=False)
        applied += 1
    return applied


register(
    Action(
        "vectorization",
        "Compute innermost maps on vectors of floats; transcendental functions go to glibc's vector math (libmvec).",
        before_autodiff=False,
        count=lambda sdfg, where, options: sum(1 for _ in _vectorizable(sdfg, where, options)),
        run=_vectorize,
        # DaCe's CUDA vector types have no math functions (abs, exp of a float4 do not compile), and CUDA kernels
        # already load whole warps' rows at once
        devices=("cpu",),
    )
)


# --- algebra ----------------------------------------------------------------------------------------------------

register(
    Action(
        "simplify_algebra",
        "Rewrite tasklets (best after tasklet_fusion) into equivalent forms with fewer transcendental calls, e.g. "
        "Mish and its derivative with one exp; each rewrite is checked against float64 over a wide input range.",
        before_autodiff=False,
        count=algebra.count,
        run=lambda sdfg, where, options, device: algebra.apply(sdfg, where, options),
        why_not=algebra.reasons,
    )
)


# --- rows -------------------------------------------------------------------------------------------------------

register(
    Action(
        "fuse_rows",
        "Expand library nodes (softmax, norms, reductions without atomics) and fuse all maps over the same rows "
        "into one parallel map with sequential loops inside, in the forward and the backward.",
        before_autodiff=False,
        count=rows.count,
        run=lambda sdfg, where, options, device: rows.apply(sdfg, where, options),
        # a row per CUDA thread, looping over its columns, reads memory a warp cannot coalesce: on an H100 Softmax
        # ran 2.2x and LayerNorm 75x slower than PyTorch eager (a GPU recipe maps a row to a warp or block)
        devices=("cpu",),
    )
)


# --- whole-SDFG optimizations -----------------------------------------------------------------------------------


def _auto_optimize(sdfg: dace.SDFG, where: Where, options: dict, device: str) -> int:
    check(where is None, "auto_optimize acts on the whole SDFG and cannot be restricted to nodes")
    expand_onnx_nodes(sdfg)
    auto_optimize(sdfg, dace.DeviceType.GPU if device == "cuda" else dace.DeviceType.CPU)
    opfixes.zeroed_transients_per_call(sdfg)
    return 1


register(
    Action(
        "auto_optimize",
        "DaCe's automatic pipeline: expand library nodes, simplify, greedy subgraph fusion, tiled reductions, "
        "map collapsing, fast library implementations.",
        before_autodiff=False,
        count=lambda sdfg, where, options: int(where is None),
        run=_auto_optimize,
    )
)


def _to_gpu(sdfg: dace.SDFG, where: Where, options: dict, device: str) -> int:
    check(where is None, "gpu moves the whole SDFG and cannot be restricted to nodes")
    return program.to_gpu(sdfg)


register(
    Action(
        "gpu",
        "Turn every outermost map and library node into GPU code and place arrays in GPU memory.",
        before_autodiff=False,
        count=lambda sdfg, where, options: 0 if where is not None or program.on_gpu(sdfg) else len(program.host_nodes(sdfg)),
        run=_to_gpu,
        devices=("cuda",),
    )
)
