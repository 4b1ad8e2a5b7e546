"""A compiled SDFG -> static metrics of its nodes for the graph's overlays: bytes moved, FLOPs, arithmetic intensity.

Bytes are what DaCe's memlets say a node reads and writes: the volume of each memlet on its edges times the size of
an element of its data. A map's are those crossing its entry and exit (DaCe's propagated memlets: what the whole
map reads and writes), a tasklet's those of one execution times the iterations of the maps around it.

FLOPs come from DaCe's work analysis (``dace.sdfg.performance_evaluation.work_depth.analyze_sdfg``, the one its
VS Code extension shows): it counts the arithmetic of each tasklet's code (a call of exp, tanh, log, sqrt counts
one), adds the reductions of write-conflict resolutions, sums a map's body over its range, and has formulas for
DaCe's own BLAS and Reduce library nodes. dcnb's SDFGs hold ONNX library nodes it does not know; so, on a copy:

- an Einsum of two operands (what dcnb makes of MatMul and Gemm) counts 2 per point of its index space, 2·M·N·K
  for a matrix product (its expansion calls a BLAS, whose work the analysis cannot see);
- every other unknown library node is expanded (as code generation expands it) and its expansion analyzed;
- a call DaCe's table does not list (erf) counts one, as exp does there (DaCe would count none).

Where the work cannot be known (C++ tasklets: dcnb's vector code, BLAS calls; loops in a tasklet), or a size stays
symbolic, the node has no ``flops`` (and no ``intensity``). Totals are per execution of the node's state: a node in
a map counts for all of the map's iterations; a state inside a loop counts once.
"""

from __future__ import annotations

import ast
import copy
import math
import warnings
from collections.abc import Callable
from typing import Any

import dace
import sympy as sp
from dace.config import Config, temporary_config
from dace.sdfg import infer_types, nodes
from dace.sdfg.performance_evaluation import work_depth
from dace.sdfg.performance_evaluation.helpers import get_uuid

from ..fixes import reduce_node
from . import profile, sources
from .sources import expansions

SIDES = ("forward", "backward")
#: what a step's metrics are kept as in its analysis (``Session.analysis``), where the widget and the static
#: rendering both read them
NAME = "overlays"

#: the nodes measured (a map's exit shows its map's)
_MEASURED = (nodes.MapEntry, nodes.MapExit, nodes.Tasklet, nodes.LibraryNode, nodes.NestedSDFG)
#: the work of what cannot be counted: an expression holding it has no number
_UNKNOWN = sp.Symbol("__dcnb_unknown_work")


def of(session: Any, index: int | None = None) -> dict[str, dict[str, dict[str, float]] | None]:
    """The metrics of the forward and backward SDFGs as compiled at good step ``index`` (the current one by
    default): ``{"forward": metrics, "backward": metrics or None}``, each as ``metrics`` returns it. Worked out
    once per step (they take seconds on a large graph) and kept in its analysis, then ``known``."""
    analysis = session.analysis(index)

    def worked_out() -> dict[str, dict[str, dict[str, float]] | None]:
        sdfgs = zip(SIDES, session.compiled_sdfgs(index))
        return {side: None if s is None else _metrics(s, sources.expanded(s, analysis, side)) for side, s in sdfgs}

    return analysis.result(NAME, worked_out)


def known(session: Any, index: int | None = None) -> dict[str, dict[str, dict[str, float]] | None] | None:
    """``of``'s metrics of step ``index`` where they were worked out, else None (nothing is worked out here)."""
    return session.analysis(index).known(NAME)


def measured(session: Any, index: int | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """What the views draw of step ``index``'s nodes: side -> node guid -> its ``known`` bytes, FLOPs and
    intensity, with ``ms`` where the step was profiled (``profile.measured``)."""
    static = known(session, index) or {}
    found = {side: {guid: dict(m) for guid, m in (static.get(side) or {}).items()} for side in SIDES}
    timed = profile.measured(session, index)
    for kernel in timed["kernels"] if timed is not None else ():
        found[kernel["side"]].setdefault(kernel["guid"], {})["ms"] = kernel["ms"]
    return found


def metrics(sdfg: dace.SDFG) -> dict[str, dict[str, float]]:
    """``{node guid: {"bytes": int, "flops": int, "intensity": float}}`` for the maps (entry and exit alike),
    tasklets, library nodes and nested SDFGs of ``sdfg``, nested SDFGs' contents included; a value that cannot be
    worked out is left out (``intensity`` needs both, and bytes above 0)."""
    return _metrics(sdfg, sources.expanded(sdfg))


def _metrics(
    sdfg: dace.SDFG, expanded: dict[str, tuple[nodes.Node, dace.SDFGState]] | None
) -> dict[str, dict[str, float]]:
    """``metrics``, counting the work of library nodes where code generation expanded them into ``expanded``
    (``sources.expanded``; None: in an expansion of a copy of their own)."""
    analyzed = copy.deepcopy(sdfg)  # (guids kept: DaCe's deepcopy keeps them, but for access nodes)
    work = _analyze(analyzed, _library_work(sdfg, expanded))
    by_guid = {node.guid: (node, state) for node, state in analyzed.all_nodes_recursive()}
    result: dict[str, dict[str, float]] = {}
    for node, state in sdfg.all_nodes_recursive():
        if not isinstance(node, _MEASURED):
            continue
        entry = state.entry_node(node) if isinstance(node, nodes.MapExit) else node
        times = _iterations(entry, state)
        found: dict[str, float] = {}
        moved = _bytes(entry, state)
        if moved is not None and times is not None:
            found["bytes"] = moved * times
        flops = work.get(get_uuid(*by_guid[entry.guid]))
        if flops is not None and times is not None:
            found["flops"] = flops * times
        if found.get("bytes") and "flops" in found:
            found["intensity"] = found["flops"] / found["bytes"]
        if found:
            result[node.guid] = found
    return result


def _analyze(
    sdfg: dace.SDFG,
    library_work: Callable[[nodes.LibraryNode, dace.SDFGState], int | None],
    values: dict[str, Any] | None = None,
) -> dict[str, int]:
    """DaCe's work analysis of ``sdfg`` (which it changes: give it a copy): the work of one execution of each of
    its nodes and of itself, by DaCe's id of them (``get_uuid``), where it is a number. ``library_work`` gives
    that of a library node without a formula in DaCe; ``values``, those of the symbols ``sdfg`` takes."""
    known = {}
    for number, (node, state) in enumerate(sdfg.all_nodes_recursive()):
        if isinstance(node, nodes.LibraryNode) and type(node) not in work_depth.LIBNODES_TO_WORK:
            work = library_work(node, state)
            # named apart: the analysis gives such a node the symbol "<name>_work", which namesakes would share
            node.name = f"__dcnb_library_{number}"
            if work is not None:
                known[f"{node.name}_work"] = work
    sdfg.reset_cfg_list()
    found: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (C++ tasklets: counted as unknown here)
        work_depth.analyze_sdfg(sdfg, found, _tasklet_work, [])
    states = {get_uuid(n, s): s for n, s in sdfg.all_nodes_recursive() if isinstance(n, nodes.Node)}
    work = {}
    for uuid, (expression, _) in found.items():
        inner = _values(states[uuid].sdfg) if uuid in states else {}
        number = _number(expression, {**(values or {}), **inner, **known})
        if number is not None:
            work[uuid] = number
    return work


def _library_work(
    sdfg: dace.SDFG, expanded: dict[str, tuple[nodes.Node, dace.SDFGState]] | None
) -> Callable[[nodes.LibraryNode, dace.SDFGState], int | None]:
    """The work of one execution of a library node of ``sdfg`` (or of a copy: found by guid) that DaCe has no
    formula for: an Einsum's, else that of its expansion, analyzed on its own (where the Einsums it holds count
    so too); None where it is not known. The library nodes are expanded once, as code generation does: in
    ``expanded``, the copy the generated code is read from where the build folder is there (``sources.expanded``:
    one expansion for both), else in a copy of their own."""
    if expanded is None:
        expanded_copy = copy.deepcopy(sdfg)
        with expansions(expanded_copy) as expanded:
            _expand_unknown(expanded_copy)

    def work(node: nodes.LibraryNode, state: dace.SDFGState) -> int | None:
        flops = _einsum_flops(node, state)
        if flops is not None:
            return _number(flops, _values(state.sdfg))
        new, new_state = expanded.get(node.guid, (None, None))
        if isinstance(new, nodes.Tasklet):
            return _number(_tasklet_work(new, new_state)[0], {})
        if not isinstance(new, nodes.NestedSDFG):
            return None
        alone = copy.deepcopy(new.sdfg)  # (without its parents: analyzed as an SDFG of its own)
        return _analyze(alone, work, _values(new.sdfg)).get(get_uuid(alone))

    return work


def _expand_unknown(sdfg: dace.SDFG) -> None:
    """Expand, until none is left, the library nodes whose work the analysis cannot tell (as code generation
    does: connector types and default schedules first). One whose expansion fails stays, its work unknown."""
    infer_types.infer_connector_types(sdfg)
    infer_types.set_default_schedule_and_storage_types(sdfg, None)
    failed: set[int] = set()
    # new nodes need no line information: its inspection of the stack took a third of the time
    with temporary_config(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Config.set("compiler", "lineinfo", value="none")
        while True:
            pending = [
                (n, s)
                for n, s in sdfg.all_nodes_recursive()
                if isinstance(n, nodes.LibraryNode) and id(n) not in failed and not _counted(n, s)
            ]
            if not pending:
                return
            for node, state in pending:
                try:
                    node.expand(state)
                except Exception:  # noqa: BLE001 -- DaCe's expansions raise what they raise; the work stays unknown
                    failed.add(id(node))


def _counted(node: nodes.LibraryNode, state: dace.SDFGState) -> bool:
    """Whether the analysis counts ``node`` as it is: DaCe's formulas, or an Einsum's here."""
    return type(node) in work_depth.LIBNODES_TO_WORK or _einsum_flops(node, state) is not None


def _einsum_flops(node: nodes.LibraryNode, state: dace.SDFGState) -> Any:
    """An Einsum of two operands (ONNX's): a multiply and an add per point of its index space (2·M·N·K for a
    matrix product), as an expression of the operands' sizes; None for any other node."""
    if getattr(getattr(node, "schema", None), "name", None) != "Einsum":
        return None
    inputs, _, _ = node.equation.replace(" ", "").partition("->")
    terms = inputs.split(",")
    if len(terms) != 2 or "..." in inputs:
        return None
    sizes = {}
    for k, term in enumerate(terms):
        edge = next(state.in_edges_by_connector(node, f"Inputs__{k}"), None)
        if edge is None:
            return None
        shape = edge.data.subset.size()
        if len(shape) != len(term):
            return None
        sizes.update(zip(term, shape))
    return 2 * math.prod(sizes.values())


class _Counter(work_depth.ArithmeticCounter):
    """DaCe's count of a tasklet's arithmetic, where a call its table does not list (erf) counts one, as exp and
    tanh do there, rather than none."""

    def visit_Call(self, node: ast.Call) -> None:
        if ast.unparse(node.func) in work_depth.PYFUNC_TO_ARITHMETICS:
            return super().visit_Call(node)
        self.count += 1
        return self.generic_visit(node)


def _tasklet_work(node: nodes.Tasklet, state: dace.SDFGState) -> tuple[Any, Any]:
    """The work of one execution of a tasklet, for ``analyze_sdfg`` (and no depth): none for one that reads no
    data (it writes a constant: LayerNorm's epsilon, in C++ as often), else unknown but for Python code without
    loops. A vectorized tasklet (``vectorization``: connectors of vector types) does its code once per lane."""
    if all(e.data.is_empty() for e in state.in_edges(node)):
        return 0, -1
    if node.code.language != dace.Language.Python:
        if node.label == reduce_node.ROW_TASKLET:  # one maximum (or minimum, product) per element of its row
            return state.in_edges(node)[0].data.volume, -1
        return _UNKNOWN, -1
    counter = _Counter()
    try:
        for statement in node.code.code:
            counter.visit(statement)
    except NotImplementedError:  # loops, matrix products in a tasklet
        return _UNKNOWN, -1
    connectors = [*node.in_connectors.values(), *node.out_connectors.values()]
    lanes = max((getattr(t, "veclen", 1) for t in connectors if t is not None), default=1)
    return counter.count * lanes, -1


def _bytes(node: nodes.Node, state: dace.SDFGState) -> int | None:
    """What one execution of ``node`` reads and writes (a map: crossing its entry and exit), in bytes."""
    exit_node = state.exit_node(node) if isinstance(node, nodes.MapEntry) else node
    edges = [*state.in_edges(node), *state.out_edges(exit_node)]
    values = _values(state.sdfg)
    total = 0
    for edge in edges:
        if edge.data.is_empty():
            continue
        volume = _number(edge.data.volume, values)
        if volume is None:
            return None
        total += volume * state.sdfg.arrays[edge.data.data].dtype.bytes
    return total


def _iterations(node: nodes.Node, state: dace.SDFGState) -> int | None:
    """How often ``node`` runs per execution of the outermost state: the iterations of the maps around it, and
    around the nested SDFGs it is in."""
    total = 1
    scope = state.entry_node(node)
    while scope is not None:
        size = _number(scope.map.range.num_elements(), _values(state.sdfg)) if isinstance(scope, nodes.MapEntry) else 1
        if size is None:
            return None
        total *= size
        scope = state.entry_node(scope)
    parent = state.sdfg.parent_nsdfg_node
    if parent is None:
        return total
    outer = _iterations(parent, state.sdfg.parent)
    return None if outer is None else total * outer


def _values(sdfg: dace.SDFG) -> dict[str, Any]:
    """The values of the symbols ``sdfg`` uses: its constants, and those its nested SDFG node maps in."""
    values = dict(sdfg.constants)
    node = sdfg.parent_nsdfg_node
    if node is not None:
        outer = _values(sdfg.parent_sdfg)
        for name, expression in node.symbol_mapping.items():
            number = _number(expression, outer)
            if number is not None:
                values[name] = number
    return values


def _number(expression: Any, values: dict[str, Any]) -> int | None:
    """An expression's value as a whole number, with ``values`` for its symbols; None where it stays symbolic."""
    expression = dace.symbolic.pystr_to_symbolic(expression) if isinstance(expression, str) else sp.sympify(expression)
    expression = expression.subs({s: values[s.name] for s in expression.free_symbols if s.name in values})
    if not expression.is_number or not expression.is_finite:
        return None
    return round(float(expression))
