"""The transformations a session offers, as data: a registry of named Actions.

An action acts either before autodiff (on the forward SDFG, after which the backward is regenerated, so that
autodiff differentiates the transformed code: DaCeML's tasklet-fusion trick) or after it (on the forward and
backward SDFGs alike). ``where`` restricts an action to matches touching the named nodes (node labels, as the
graph views show them: map, tasklet, library-node labels, or array names for access nodes).
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable, Iterable
from typing import NamedTuple

import dace
from dace.libraries.onnx.nodes.onnx_op import ONNXOp
from dace.sdfg import nodes
from dace.sdfg.state import StateSubgraphView
from dace.transformation import PatternTransformation
from dace.transformation.dataflow import MapFusion, TaskletFusion, TrivialMapElimination
from dace.transformation.onnx.optimize import expand_onnx_nodes
from dace.transformation.subgraph import SubgraphFusion

from .. import dace_internals, passes
from ..errors import check
from ..fixes import registry
from ..passes import auto_optimize, cuda_build
from ..passes.simplify import simplify
from . import algebra, layout, matching, rows, shared_values, tuners, vectorize
from .matching import Where


@dataclasses.dataclass(frozen=True)
class Bound:
    """One place an action applies, as its ``places`` finds it: the labels ``where`` takes to apply it there
    (labels outlive the SDFG: a recipe replays them on regenerated SDFGs), and the nodes it binds in the SDFG
    searched (so that a view can mark those nodes, not every node sharing a label)."""

    labels: tuple[str, ...]
    nodes: tuple[nodes.Node, ...]


class Place(NamedTuple):
    """Where an action applies, one place of ``Session.places``: ``apply(name, where=place.labels)`` applies it
    there; ``guids`` are the nodes it binds in the current picture of ``side`` (``graph.describe``'s ``guid``)."""

    side: str
    labels: tuple[str, ...]
    guids: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Action:
    """A named transformation: how many places it matches in an SDFG, and how to apply it there.

    ``Session.actions()`` returns the registered actions with ``matches`` filled in for the session's SDFGs.
    """

    name: str
    description: str
    #: True: acts on the forward SDFG before autodiff; False: on both SDFGs after it
    before_autodiff: bool
    count: Callable[[dace.SDFG, Where, dict], int]
    #: run(sdfg, where, options, device) -> places applied
    run: Callable[[dace.SDFG, Where, dict, str], int]
    #: devices ("cpu", "cuda") the action is offered on
    devices: tuple[str, ...] = ("cpu", "cuda")
    #: whether what it makes depends on the device it runs for (auto_optimize's library choices): a CPU step's
    #: CUDA build applies it again for CUDA
    for_device: bool = False
    #: why_not(sdfg, where, options) -> reasons the action left candidate places alone (for "matches nothing")
    why_not: Callable[[dace.SDFG, Where, dict], list[str]] | None = None
    #: places(sdfg, where, options) -> each place it applies, as the labels and nodes there: ``where`` set to
    #: one place's labels applies it there (None: it acts on the whole SDFG only)
    places: Callable[[dace.SDFG, Where, dict], list[Bound]] | None = None
    #: the options it takes (``Session.apply``'s keywords, a recipe entry's ``options``); any other is refused
    options: tuple[str, ...] = ()
    #: the options a search tries it with when not told which actions to try, one candidate each (``search._entries``)
    searched: tuple[dict, ...] = ({},)
    #: whether it lays out the arrays the library nodes read, which chooses their kernels: a search tries it right
    #: after its reference (``search._first_level``)
    layout: bool = False
    #: places it matches in a session's SDFGs now (None: not counted)
    matches: int | None = None
    #: where it matches now, as ``Session.places`` lists it (None: not listed)
    at: tuple[Place, ...] | None = None

    @property
    def phase(self) -> str:
        return "before autodiff" if self.before_autodiff else "after autodiff"

    def check_options(self, options: dict) -> None:
        """Raise StepError naming the options it does not take (a misspelt one would otherwise go unused)."""
        unknown = sorted(set(options) - set(self.options))
        *most, last = self.options or ("",)
        takes = f"the options {', '.join(most)} and {last}" if most else f"the option {last}" if last else "no options"
        check(not unknown, f"{self.name} takes {takes}, not {', '.join(unknown)}")


REGISTRY: dict[str, Action] = {}


def register(action: Action) -> Action:
    REGISTRY[action.name] = action
    return action


def get(name: str) -> Action:
    if name not in REGISTRY:
        raise KeyError(f"unknown action {name!r}; the actions are: {', '.join(REGISTRY)}")
    return REGISTRY[name]


# --- pattern transformations, one match at a time so that `where` can filter ---------------------------------


def _places(xform: type[PatternTransformation]) -> Callable[[dace.SDFG, Where, dict], list[Bound]]:
    def places(sdfg: dace.SDFG, where: Where, options: dict) -> list[Bound]:
        bound = [dace_internals.pattern_nodes(m) for m in matching.matches(xform, sdfg, where, options)]
        return _distinct([[n for n in group if isinstance(n, nodes.AccessNode)] for group in bound], bound)

    return places


def _distinct(short: list[list[nodes.Node]], full: list[list[nodes.Node]]) -> list[Bound]:
    """Each place by its ``short`` labels (the arrays a match binds: maps and tasklets it fuses are named anew, so
    applying there does not go on to the next match) where those name no other place, else by its ``full`` ones;
    its nodes are all it binds either way."""
    shorts = [_labels(group) for group in short]
    return [
        Bound(labels if labels and shorts.count(labels) == 1 else _labels(whole), tuple(whole))
        for labels, whole in zip(shorts, full)
    ]


def _labels(found: Iterable[nodes.Node]) -> tuple[str, ...]:
    return tuple(sorted({matching.label(n) for n in found}))


def _bound(found: Iterable[nodes.Node]) -> Bound:
    """The place of ``found``, by all their labels."""
    found = tuple(found)
    return Bound(_labels(found), found)


def _each(
    found: Callable[[dace.SDFG, Where, dict], list[nodes.Node]],
) -> Callable[[dace.SDFG, Where, dict], list[Bound]]:
    """Places of one node each, from what ``found`` lists."""
    return lambda sdfg, where, options: [_bound([n]) for n in found(sdfg, where, options)]


def _counted(places: Callable[[dace.SDFG, Where, dict], list[Bound]]) -> Callable[[dace.SDFG, Where, dict], int]:
    return lambda sdfg, where, options: len(places(sdfg, where, options))


def _repeat(xform: type[PatternTransformation]) -> Callable[[dace.SDFG, Where, dict, str], int]:
    def run(sdfg: dace.SDFG, where: Where, options: dict, device: str = "cpu") -> int:
        return matching.apply_in_rounds_then_propagate(
            sdfg, lambda: matching.matches(xform, sdfg, where, options), lambda match: matching.touches(match, where)
        )

    return run


# --- expand ---------------------------------------------------------------------------------------------------


def _onnx_nodes(sdfg: dace.SDFG, where: Where) -> list[ONNXOp]:
    return [n for n, _ in sdfg.all_nodes_recursive() if isinstance(n, ONNXOp) and (where is None or n.label in where)]


def _expand(sdfg: dace.SDFG, where: Where, options: dict, device: str) -> int:
    targets = _onnx_nodes(sdfg, where)
    expand_onnx_nodes(sdfg, predicate=lambda n: where is None or n.label in where)
    simplify(sdfg)
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
        places=lambda sdfg, where, options: [_bound([n]) for n in _onnx_nodes(sdfg, where)],
    )
)

register(
    Action(
        "map_fusion",
        "Fuse each producer map into its consumer map (in the forward and the backward), so that intermediates "
        "pass through registers; those the backward needs are still stored.",
        before_autodiff=False,
        count=_counted(_places(MapFusion)),
        run=_repeat(MapFusion),
        places=_places(MapFusion),
        options=tuple(MapFusion.__properties__),
    )
)


# --- subgraph fusion --------------------------------------------------------------------------------------------


def _fusable(sdfg: dace.SDFG, where: Where) -> list[StateSubgraphView]:
    groups = []
    for state in sdfg.states():
        top = [n for n in state.nodes() if state.entry_node(n) is None]
        if where is not None:
            top = [n for n in top if matching.label(n) in where or isinstance(n, nodes.AccessNode)]
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


def _outer_maps(group: StateSubgraphView) -> Bound:
    """The group by its outermost maps' labels (what ``where`` takes), binding all its maps and arrays."""
    outer = [n for n in group.nodes() if isinstance(n, nodes.MapEntry) and group.graph.entry_node(n) is None]
    return Bound(tuple(matching.label(n) for n in outer), tuple(group.nodes()))


def _subgraph_fusion(sdfg: dace.SDFG, where: Where, options: dict, device: str) -> int:
    sdfg.apply_transformations_repeated(TrivialMapElimination)
    groups = _fusable(sdfg, where)
    for subgraph in groups:  # none on one side is no error: the session refuses a step where neither side has one
        SubgraphFusion.apply_to(sdfg, subgraph.nodes(), **options)
    return len(groups)


register(
    Action(
        "subgraph_fusion",
        "Fuse all maps of a state (or the selected ones) into one map, in the forward and the backward.",
        before_autodiff=False,
        count=lambda sdfg, where, options: len(_fusable(sdfg, where)),
        run=_subgraph_fusion,
        places=lambda sdfg, where, options: [_outer_maps(group) for group in _fusable(sdfg, where)],
        options=tuple(SubgraphFusion.__properties__),
    )
)

def _fused_copy(sdfg: dace.SDFG, where: Where) -> dace.SDFG:
    fused = copy.deepcopy(sdfg)
    _repeat(MapFusion)(fused, where, {})
    shared_values.split(fused)
    return fused


def _tasklet_places(sdfg: dace.SDFG, where: Where, options: dict) -> list[Bound]:
    """Each pair of tasklets it would merge, named by the two tasklets and the arrays between their maps: what
    restricts both the map fusion that comes first and the merge to this pair. Its nodes are those of ``sdfg``:
    the two tasklets (the fused copy keeps their guids) and the arrays between them."""
    fused = _fused_copy(sdfg, where)
    pairs = [dace_internals.pattern_nodes(m) for m in matching.matches(TaskletFusion, fused, where, options)]
    found = []
    for pair in pairs:
        guids = {n.guid for n in pair if isinstance(n, nodes.Tasklet)}
        tasklets = [n for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nodes.Tasklet) and n.guid in guids]
        between = _between(sdfg, tasklets)
        labels = {n.label for n in pair if isinstance(n, nodes.Tasklet)} | {n.data for n in between}
        found.append(Bound(tuple(sorted(labels)), (*tasklets, *between)))
    return found


def _between(sdfg: dace.SDFG, tasklets: list[nodes.Tasklet]) -> list[nodes.AccessNode]:
    """The access nodes that pass from the map of one of ``tasklets`` into the map of another (in ``sdfg``,
    before the maps are fused)."""
    arrays = []
    for state in sdfg.states():
        entries = {state.entry_node(n) for n in state.nodes() if isinstance(n, nodes.Tasklet) and n in tasklets}
        entries.discard(None)
        exits = {state.exit_node(e) for e in entries}
        for node in state.data_nodes():
            into = any(e.dst in entries for e in state.out_edges(node))
            if into and any(e.src in exits for e in state.in_edges(node)):
                arrays.append(node)
    return arrays


def _tasklet_fusion(sdfg: dace.SDFG, where: Where, options: dict, device: str) -> int:
    # TaskletFusion merges tasklets within one scope, so maps are fused first; that intermediate never
    # reaches autodiff, which cannot forward values computed inside a map (see program.differentiate)
    _repeat(MapFusion)(sdfg, where, {})
    shared_values.split(sdfg)
    merged = _repeat(TaskletFusion)(sdfg, where, options)
    shared_values.join_inputs(sdfg)
    return merged


register(
    Action(
        "tasklet_fusion",
        "Fuse maps and merge their chains of tasklets into one expression before autodiff: the backward then "
        "recomputes the intermediates instead of storing them.",
        before_autodiff=True,
        count=_counted(_tasklet_places),
        run=_tasklet_fusion,
        places=_tasklet_places,
        options=tuple(TaskletFusion.__properties__),
    )
)


# --- vectorization ----------------------------------------------------------------------------------------------

register(
    Action(
        "vectorization",
        "Compute innermost maps on vectors of floats; transcendental functions go to glibc's vector math (libmvec).",
        before_autodiff=False,
        count=vectorize.count,
        run=lambda sdfg, where, options, device: vectorize.apply(sdfg, where, options),
        places=_each(vectorize.places),
        options=("vector_len",),
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
        places=_each(algebra.places),
        options=("form",),
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


# --- what DaCe's cutout tuners tune: tile sizes, the order of a map's dimensions -------------------------------

register(
    Action(
        "map_tiling",
        "Tile the innermost dimensions of each outermost map (DaCe's MapTiling): a parallel map over tiles around a "
        "sequential map over one, so that a tile's rows and columns stay in cache; size= sets the tile.",
        before_autodiff=False,
        count=tuners.tiling_count,
        run=lambda sdfg, where, options, device: tuners.tile(sdfg, where, options),
        places=_each(tuners.tiling_places),
        options=("size", "dims"),
        why_not=tuners.tiling_reasons,
        # 16: a row of 16 floats is a 64-byte cache line, 16 x 16 a 1 KiB block; 64: 16 KiB, half of an L1 cache
        searched=({"size": 16}, {"size": 64}),
        # on a GPU the outermost map is the kernel's grid, and its tiles are thread blocks (tuners.py)
        devices=("cpu",),
    )
)

register(
    Action(
        "map_permutation",
        "Reorder the dimensions of each outermost map (DaCe's MapDimShuffle): order= as numpy.transpose's axes, for "
        "maps of that many dimensions; by default the two outermost swapped, in maps of three or more.",
        before_autodiff=False,
        count=tuners.permutation_count,
        run=lambda sdfg, where, options, device: tuners.permute(sdfg, where, options),
        places=_each(tuners.permutation_places),
        options=("order",),
        why_not=tuners.permutation_reasons,
        devices=("cpu",),
    )
)


# --- layout -----------------------------------------------------------------------------------------------------

register(
    Action(
        "channels_last",
        "Store the images around the convolutions channels-last (NHWC) in the forward and the backward: PyTorch's "
        "convolutions then run their channels-last kernels, BatchNorm and elementwise maps go over rows of channels.",
        before_autodiff=True,
        count=lambda sdfg, where, options: len(layout.images(sdfg, where)),
        run=lambda sdfg, where, options, device: layout.apply(sdfg, where),
        places=_each(lambda sdfg, where, options: layout.images(sdfg, where)),
        # the convolutions channels-last are PyTorch's CPU kernels (fixes/conv.py); cuDNN's are not measured so
        devices=("cpu",),
        layout=True,
    )
)


# --- whole-SDFG optimizations -----------------------------------------------------------------------------------


def _auto_optimize(sdfg: dace.SDFG, where: Where, options: dict, device: str) -> int:
    check(where is None, "auto_optimize acts on the whole SDFG and cannot be restricted to nodes")
    expand_onnx_nodes(sdfg)
    # gap: auto_optimize sets every library node to the first "fast" implementation it finds, "pure" where no
    # BLAS of its own is installed: reductions then added with atomics again (a BERT layer's LayerNorm backward took
    # 314 ms) and matrix products went to loops or to a BLAS whose threads fight OpenMP's; on a GPU, to DaCe's
    # cuBLAS and cuTENSOR, whose headers clash with gpu_libs.h or are not installed ("cutensor.h: No such file" on
    # an H100). dcnb's choices (fixes.linalg, fixes.reduction: cuBLAS through gpu_libs on a GPU) come first
    library = lambda _: [registry.CHOOSE]
    auto_optimize.run(sdfg, dace.DeviceType.GPU if device == "cuda" else dace.DeviceType.CPU, library=library)
    passes.run(passes.AFTER_AUTO_OPTIMIZE, sdfg)
    return 1


register(
    Action(
        "auto_optimize",
        "DaCe's automatic pipeline: expand library nodes, simplify, greedy subgraph fusion, tiled reductions, "
        "map collapsing, fast library implementations.",
        before_autodiff=False,
        count=lambda sdfg, where, options: int(where is None),
        run=_auto_optimize,
        for_device=True,
    )
)


def _to_gpu(sdfg: dace.SDFG, where: Where, options: dict, device: str) -> int:
    check(where is None, "gpu moves the whole SDFG and cannot be restricted to nodes")
    return cuda_build.to_gpu(sdfg)


register(
    Action(
        "gpu",
        "Turn every outermost map and library node into GPU code and place arrays in GPU memory.",
        before_autodiff=False,
        count=lambda sdfg, where, options: 0 if where is not None or cuda_build.on_gpu(sdfg) else len(cuda_build.host_nodes(sdfg)),
        run=_to_gpu,
        devices=("cuda",),
    )
)
