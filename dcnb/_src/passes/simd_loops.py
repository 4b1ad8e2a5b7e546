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
tasklets and their data only, no sum (write-conflict resolution), and every array element the loop reads or writes
one at a time and contiguously along it (no gathers nor scatters, which the pragma would force on the compiler).
"""

from __future__ import annotations

import copy

import dace
import sympy
from dace import dtypes, registry, subsets
from dace.codegen.instrumentation.provider import InstrumentationProvider
from dace.sdfg import nodes

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
        found = [(e, state.exit_node(e)) for e in children[None] if isinstance(e, nodes.MapEntry)]
        found = [(entry, exit_) for entry, exit_ in found if _elementwise(state, entry, exit_, children[entry])]
        for entry, exit_ in found:
            _split_last(state, entry, exit_)
        changed += len(found)
    return changed


def _elementwise(state: dace.SDFGState, entry: nodes.MapEntry, exit_: nodes.MapExit, body: list) -> bool:
    """Whether ``entry``'s map is parallel over two dimensions or more, the last not collapsed into the parallel
    loop, and its body (``body``: the nodes in its scope) elementwise work the pragma may vectorize (the module's
    docstring)."""
    map_ = entry.map
    if map_.schedule != dtypes.ScheduleType.CPU_Multicore or len(map_.params) < 2 or map_.collapse >= len(map_.params):
        return False
    if map_.range[-1][2] != 1 or any(c is not None and not c.startswith("IN_") for c in entry.in_connectors):
        return False
    inside = [n for n in body if n is not exit_]
    for node in inside:
        if isinstance(node, nodes.Tasklet):
            if node.language != dtypes.Language.Python:
                return False
        elif not isinstance(node, nodes.AccessNode):
            return False
    edges = {e for n in inside for e in (*state.in_edges(n), *state.out_edges(n))}
    if any(e.data.wcr is not None for e in [*edges, *state.out_edges(exit_)]):
        return False
    return all(_along(e.data, state.sdfg, map_.params[-1]) for e in edges if not e.data.is_empty())


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
