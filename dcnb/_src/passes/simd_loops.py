"""The innermost loop of a parallel map of elementwise work, written ``#pragma omp simd``: a policy each CPU build
applies to the SDFG it compiles.

gap: DaCe's CPU code generator writes no ``omp simd`` on a map's loops, and GCC leaves some of them scalar that it
vectorizes with it. auto_optimize fuses a Linear's bias add with GELU's seven elementwise ops into one map writing
the six results the backward keeps; GCC vectorized none of its inner loop ("no vectype", ``-fopt-info-vec``), so
its ``tanh`` ran one element at a time. Under ``omp simd`` the same loop is vectorized with 64-byte vectors: on the
GPT-2 small block (8x128x768, an Intel Xeon's 2 cores) that map took 4.9-5.1 ms against 43.6-53.0 without.

Such a map's last dimension becomes a sequential map of its own inside it (as DaCe's MapExpansion would split it),
which carries ``SIMD_LOOP`` as its instrumentation: the provider below writes the pragma where DaCe's CPU code
generator calls instrumentation, right before that map's loop. The pragma promises
what a map already does (its iterations independent), so only maps that keep that promise inside are taken: Python
tasklets (and C++ ones of one assignment) and their data only, no sum (write-conflict resolution), and every array
element the loop reads or writes one at a time and contiguously along it (no gathers nor scatters, which the pragma
would force on the compiler). The loops along a row that fuse_rows leaves inside its parallel row maps are taken
alike.
"""

from __future__ import annotations

import copy
import re

import dace
import sympy
from dace import dtypes, registry, subsets
from dace.codegen.instrumentation.provider import InstrumentationProvider
from dace.sdfg import nodes
from dace.sdfg.graph import MultiConnectorEdge

from .schedule import _inside_map

if "DCNB_SIMD_LOOP" not in dtypes.InstrumentationType.__members__:
    dtypes.InstrumentationType.register("DCNB_SIMD_LOOP")

#: the instrumentation that marks a loop for ``omp simd``
SIMD_LOOP = dtypes.InstrumentationType.DCNB_SIMD_LOOP


@registry.autoregister_params(type=SIMD_LOOP)
class SimdLoop(InstrumentationProvider):
    """Writes ``#pragma omp simd`` before the loop of a sequential map so marked (by ``apply``)."""

    def writes_to_report(self) -> bool:
        return False

    def on_scope_entry(self, sdfg, cfg, state, node, outer_stream, inner_stream, global_stream) -> None:
        if isinstance(node, nodes.MapEntry) and node.map.schedule == dtypes.ScheduleType.Sequential:
            if len(node.map.params) == 1:
                outer_stream.write("#pragma omp simd", cfg, cfg.node_id(state), node)


def apply(sdfg: dace.SDFG) -> int:
    """Give every parallel map of elementwise work its innermost dimension as an ``omp simd`` loop; returns how
    many maps changed. Runs after ``schedule.apply``, whose parallel maps and collapse it keeps."""
    changed = 0
    for state in [s for nested in sdfg.all_sdfgs_recursive() for s in nested.states()]:
        if _inside_map(state.sdfg):
            continue
        # every map of the state judged on one scope tree, then split by hand: DaCe's MapExpansion rebuilt the
        # state's scope tree and memlets after each map (a 12-layer ViT's auto_optimize step took minutes more)
        children = state.scope_children()
        accesses: dict[str, list[nodes.AccessNode]] = {}
        for node in state.data_nodes():
            accesses.setdefault(node.data, []).append(node)
        found = [(e, state.exit_node(e)) for e in children[None] if isinstance(e, nodes.MapEntry)]
        rows = [r for entry, _ in found for r in _row_loops(state, entry, children, accesses)]
        found = [
            (entry, exit_) for entry, exit_ in found if _elementwise(state, entry, exit_, children[entry], accesses)
        ]
        for entry, exit_ in found:
            _split_last(state, entry, exit_)
        for row in rows:
            row.map.instrument = SIMD_LOOP
        changed += len(found) + len(rows)
    return changed


def _elementwise(
    state: dace.SDFGState, entry: nodes.MapEntry, exit_: nodes.MapExit, body: list, accesses: dict[str, list]
) -> bool:
    """Whether ``entry``'s map is parallel over two dimensions or more, the last not collapsed into the parallel
    loop, and its body (``body``: the nodes in its scope) elementwise work the pragma may vectorize (the module's
    docstring)."""
    map_ = entry.map
    if map_.schedule != dtypes.ScheduleType.CPU_Multicore or len(map_.params) < 2 or map_.collapse >= len(map_.params):
        return False
    return _vectorizable(state, entry, exit_, body, accesses)


def _row_loops(
    state: dace.SDFGState, entry: nodes.MapEntry, children: dict, accesses: dict[str, list]
) -> list[nodes.MapEntry]:
    """The sequential maps of one dimension directly inside parallel map ``entry`` whose body is elementwise work
    the pragma may vectorize: the loops along a row that fuse_rows (actions/rows.py) leaves in its row maps, where
    GCC left GELU's ``erf`` one element at a time (ConvNeXt-T)."""
    if entry.map.schedule != dtypes.ScheduleType.CPU_Multicore:
        return []
    return [
        n for n in children[entry]
        if isinstance(n, nodes.MapEntry)
        and n.map.schedule == dtypes.ScheduleType.Sequential
        and len(n.map.params) == 1
        and n.map.instrument == dtypes.InstrumentationType.No_Instrumentation
        and _vectorizable(state, n, state.exit_node(n), children[n], accesses)
    ]


def _vectorizable(
    state: dace.SDFGState, entry: nodes.MapEntry, exit_: nodes.MapExit, body: list, accesses: dict[str, list]
) -> bool:
    """Whether ``entry``'s map's last dimension steps by one, and its body (``body``: the nodes in its scope) is
    elementwise work along it the pragma may vectorize (the module's docstring); ``accesses``: the state's access
    nodes by array."""
    map_ = entry.map
    if map_.range[-1][2] != 1 or any(c is not None and not c.startswith("IN_") for c in entry.in_connectors):
        return False
    inside = [n for n in body if n is not exit_]
    for node in inside:
        if isinstance(node, nodes.Tasklet):
            if node.language != dtypes.Language.Python and not _one_assignment(node):
                return False
        elif not isinstance(node, nodes.AccessNode):
            return False
    # an element written along the loop is each iteration's own only where the array is declared inside it
    written = {n.data for n in inside if isinstance(n, nodes.AccessNode) and state.in_degree(n) > 0}
    declared_inside = set(inside)
    if any(state.sdfg.arrays[a].total_size == 1 and not set(accesses[a]) <= declared_inside for a in written):
        return False
    edges = {e for n in inside for e in (*state.in_edges(n), *state.out_edges(n))}
    if any(e.data.wcr is not None for e in [*edges, *state.out_edges(exit_)]):
        return False
    return all(_moves_along(state, e, map_.params[-1]) for e in edges if not e.data.is_empty())


#: C++ code of one assignment of an expression: no loop, block nor pragma of its own (DaCe's ONNX Erf and others)
_ASSIGNMENT = re.compile(r"\s*\w+\s*=[^;{}#]*;\s*")


def _one_assignment(tasklet: nodes.Tasklet) -> bool:
    return tasklet.language == dtypes.Language.CPP and _ASSIGNMENT.fullmatch(tasklet.code.as_string) is not None


def _moves_along(state: dace.SDFGState, edge: MultiConnectorEdge, param: str) -> bool:
    """Whether ``edge``'s memlet moves one element at a time contiguously along ``param``, on both sides where it
    copies from one array to another."""
    memlet = edge.data
    if not _along(memlet, state.sdfg, param):
        return False
    path = state.memlet_path(edge)
    ends = [n.data for n in (path[0].src, path[-1].dst) if isinstance(n, nodes.AccessNode) and n.data != memlet.data]
    if not ends:
        return True
    subset = memlet.other_subset or memlet.subset
    other = state.sdfg.arrays[ends[0]]
    return len(subset) == len(other.shape) and _along(dace.Memlet(data=ends[0], subset=subset), state.sdfg, param)


def _along(memlet: dace.Memlet, sdfg: dace.SDFG, param: str) -> bool:
    """Whether ``memlet`` moves one element at a time contiguously along ``param`` (by one element or not at all)."""
    desc = sdfg.arrays[memlet.data]
    if desc.total_size == 1:  # a scalar, or an iteration's one-element array
        return True
    return memlet.subset.num_elements() == 1 and step(memlet, desc, param) in (0, 1)


def step(memlet: dace.Memlet, desc: dace.data.Data, param: str):
    """How many elements the one element ``memlet`` moves (in ``desc``'s strides) as ``param`` grows by one."""
    offset = sympy.sympify(sum(i * s for i, s in zip(memlet.subset.min_element(), desc.strides)))
    # by name: the memlet's symbols are DaCe's, which compare unequal to a plain sympy symbol of the same name
    moved = {str(s): s for s in offset.free_symbols}.get(param)
    return 0 if moved is None else sympy.expand(offset.subs(moved, moved + 1) - offset)


def _split_last(state: dace.SDFGState, entry: nodes.MapEntry, exit_: nodes.MapExit) -> None:
    """Split ``entry``'s map into its leading dimensions (parallel, collapsed as before) and its last (a sequential
    map inside it, marked ``SIMD_LOOP``), as DaCe's MapExpansion does, without its walks of the whole state. The
    edges between the two maps carry the outer ones' memlets: what the whole map reads and writes."""
    outer = entry.map
    inner = nodes.Map(
        f"{outer.label}_simd", outer.params[-1:], subsets.Range(outer.range[-1:]), dtypes.ScheduleType.Sequential
    )
    inner.instrument = SIMD_LOOP
    outer.params, outer.range = outer.params[:-1], subsets.Range(outer.range[:-1])
    inner_entry, inner_exit = nodes.MapEntry(inner), nodes.MapExit(inner)
    state.add_nodes_from([inner_entry, inner_exit])
    outside = {e.dst_conn: e.data for e in state.in_edges(entry)}
    for edge in list(state.out_edges(entry)):
        connector = edge.src_conn
        if connector is None:
            if not state.edges_between(entry, inner_entry):
                state.add_edge(entry, None, inner_entry, None, dace.Memlet())
        elif inner_entry.add_out_connector(connector):
            into = "IN_" + connector.removeprefix("OUT_")
            inner_entry.add_in_connector(into)
            state.add_edge(entry, connector, inner_entry, into, copy.deepcopy(outside[into]))
        state.add_edge(inner_entry, connector, edge.dst, edge.dst_conn, edge.data)
        state.remove_edge(edge)
    beyond = {e.src_conn: e.data for e in state.out_edges(exit_)}
    for edge in list(state.in_edges(exit_)):
        connector = edge.dst_conn
        if connector is None:
            if not state.edges_between(inner_exit, exit_):
                state.add_edge(inner_exit, None, exit_, None, dace.Memlet())
        elif inner_exit.add_in_connector(connector):
            out = "OUT_" + connector.removeprefix("IN_")
            inner_exit.add_out_connector(out)
            state.add_edge(inner_exit, out, exit_, connector, copy.deepcopy(beyond[out]))
        state.add_edge(edge.src, edge.src_conn, inner_exit, connector, edge.data)
        state.remove_edge(edge)
