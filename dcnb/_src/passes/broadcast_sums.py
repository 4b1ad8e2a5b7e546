"""Sums over a map's iterations without atomics: the gradient of a broadcast.

Where a value was broadcast in the forward (a bias added to every row, a scale multiplying every element), its
gradient is a sum: autodiff writes it as a map over every element of the forward's result whose tasklet adds its
share into the few elements of the gradient (a write-conflict resolution, WCR). On a CPU DaCe makes each of those
additions an atomic compare-and-swap loop, which the threads contend for: a BERT layer's bias gradients took 46 of
its backward's 170 ms (measured when this pass was written). Here each such map writes its terms into an array of
its own (one element per iteration, plain stores), and a Reduce library node sums them, down the columns or along
rows as ``fixes/reduce_node`` expands it, without atomics; a small map adds the sums into the gradient where the WCR
went.
"""

from __future__ import annotations

import functools

import dace
from dace.frontend.operations import detect_reduction_type
from dace.libraries.standard import Reduce
from dace.sdfg import nodes

from ..fixes import cpp
from .top_level import add_top_level_map

_PARALLEL = (dace.ScheduleType.Default, dace.ScheduleType.CPU_Multicore)


def sums_without_atomics(sdfg: dace.SDFG) -> int:
    """Turn each sum a top-level CPU map adds into fewer elements than it visits into terms and a Reduce; returns
    how many sums were turned.

    gap: DaCe's autodiff sums a broadcast input's gradient with an atomic addition per element (a bias's gradient:
    every row of the output adds into it), which the CPU's threads contend for.
    """
    turned = 0
    for state in sdfg.states():
        # the scopes read once: each sum turned changes the state, and DaCe's scope queries then walk all of it again
        scope, children = state.scope_dict(), state.scope_children()
        for entry in [n for n in state.nodes() if isinstance(n, nodes.MapEntry) and scope[n] is None]:
            if entry.map.schedule not in _PARALLEL:
                continue
            exit_node = next(n for n in children[entry] if isinstance(n, nodes.ExitNode))
            order = None  # the map's memory order, once it has a sum to turn
            for edge in list(state.out_edges(exit_node)):
                reduced = _reduced(sdfg, state, entry, edge)
                if reduced is not None:
                    order = order or _memory_order(sdfg, state, entry, children[entry])
                    _to_reduce(sdfg, state, entry, exit_node, edge, *reduced, order)
                    turned += 1
    return turned


@functools.cache
def _reduction_type(wcr: str) -> dace.dtypes.ReductionType | None:
    """DaCe's ``detect_reduction_type``, once per lambda.

    gap: it evaluates the lambda on sympy symbols and compares the result with each reduction's: 4 ms per
    write-conflict resolution, of which autodiff writes one per broadcast gradient."""
    return detect_reduction_type(wcr)


def _sizes(entry: nodes.MapEntry) -> list[int] | None:
    """The map's extent per parameter where every range is 0..n-1 with step 1 and n is a constant, else None."""
    sizes = []
    for begin, end, step in entry.map.range.ndrange():
        if begin != 0 or step != 1 or not getattr(end, "is_Integer", isinstance(end, int)):
            return None
        sizes.append(int(end) + 1)
    return sizes


def _reduced(sdfg, state, entry, edge) -> tuple[object, list[int], list[int]] | None:
    """(the inner edge, the map's sizes, the indices of the parameters it sums over) where ``edge`` leaves the map
    as a sum that every iteration adds to one element and some parameters do not index; else None."""
    if edge.data.wcr is None or edge.data.dynamic or not isinstance(edge.dst, nodes.AccessNode):
        return None
    if _reduction_type(edge.data.wcr) != dace.dtypes.ReductionType.Sum:
        return None
    if not isinstance(sdfg.arrays[edge.data.data], dace.data.Array) or edge.src_conn is None:
        return None
    inner = list(state.in_edges_by_connector(edge.src, "IN_" + edge.src_conn[4:]))
    if len(inner) != 1 or not isinstance(inner[0].src, nodes.Tasklet):
        return None
    memlet = inner[0].data
    if memlet.wcr is None or memlet.dynamic or memlet.data != edge.data.data or memlet.subset.num_elements() != 1:
        return None
    sizes = _sizes(entry)
    if sizes is None:
        return None
    params = entry.map.params
    used = {str(s) for s in memlet.subset.free_symbols}
    if not used <= set(params) or used == set(params):
        return None
    # each index is one parameter (or a constant): the kept parameters then address distinct elements
    for begin, _, _ in memlet.subset.ndrange():
        if begin.free_symbols and str(begin) not in params:
            return None
    return inner[0], sizes, [i for i, p in enumerate(params) if p not in used]


def _memory_order(sdfg: dace.SDFG, state: dace.SDFGState, entry: nodes.MapEntry, body: list) -> list[int]:
    """The map's parameters (their indices), outermost first, in the memory order of the arrays its tasklets read
    and write an element of with every parameter, one per dimension; the map's own order where there are none or
    they disagree. Over channels-last images (n, c, h, w) goes (n, h, w, c)."""
    params = entry.map.params
    orders = set()
    for node in body:
        if not isinstance(node, nodes.Tasklet):
            continue
        for edge in (*state.in_edges(node), *state.out_edges(node)):
            if edge.data.is_empty() or edge.data.subset.num_elements() != 1:
                continue
            indices = [str(begin) for begin, _, _ in edge.data.subset.ndrange()]
            if sorted(indices) != sorted(params):
                continue
            dims = cpp.memory_order(sdfg.arrays[edge.data.data])
            if dims is not None:
                orders.add(tuple(params.index(indices[d]) for d in dims))
    return list(orders.pop()) if len(orders) == 1 else list(range(len(params)))


def _to_reduce(
    sdfg, state, entry, exit_node, edge, inner, sizes: list[int], axes: list[int], order: list[int]
) -> None:
    params = entry.map.params
    target, dtype = edge.data.data, sdfg.arrays[edge.data.data].dtype
    kept = [i for i in order if i not in axes]

    # the terms laid out as the map's other arrays are, so that the map can go in memory order (memory_order.py)
    # and the sum read the terms in it: over channels-last images, each pixel's channels
    terms, _ = sdfg.add_transient(f"{target}_terms", [sizes[i] for i in order], dtype, find_new_name=True)
    # (one element where every parameter is summed over: a PReLU's single slope)
    sums, _ = sdfg.add_transient(f"{target}_sums", [sizes[i] for i in kept] or [1], dtype, find_new_name=True)
    terms_node, sums_node = state.add_access(terms), state.add_access(sums)

    # the tasklet's share: one plain store per iteration
    connector = exit_node.next_connector(terms)
    exit_node.add_in_connector("IN_" + connector)
    exit_node.add_out_connector("OUT_" + connector)
    term = dace.Memlet(f"{terms}[{', '.join(params[i] for i in order)}]")
    state.add_edge(inner.src, inner.src_conn, exit_node, "IN_" + connector, term)
    state.add_edge(exit_node, "OUT_" + connector, terms_node, None, sdfg.make_array_memlet(terms))
    state.remove_edge(inner)
    state.remove_edge(edge)
    exit_node.remove_in_connector("IN_" + edge.src_conn[4:])
    exit_node.remove_out_connector(edge.src_conn)

    reduce = Reduce("sum_" + target, wcr="lambda a, b: a + b", axes=sorted(order.index(i) for i in axes), identity=0)
    state.add_node(reduce)
    state.add_edge(terms_node, None, reduce, None, sdfg.make_array_memlet(terms))
    state.add_edge(reduce, None, sums_node, None, sdfg.make_array_memlet(sums))

    # the sums added where the tasklet added: the target's index of each kept parameter, as the inner memlet had it
    names = [f"__s{i}" for i in range(len(kept))]
    by_param = {params[i]: name for i, name in zip(kept, names)}
    index = ", ".join(by_param.get(str(b), str(b)) for b, _, _ in inner.data.subset.ndrange())
    if not kept:
        add = state.add_tasklet(f"add_{sums}", {"__in"}, {"__out"}, "__out = __in")
        state.add_edge(sums_node, None, add, "__in", dace.Memlet(f"{sums}[0]"))
        state.add_edge(add, "__out", edge.dst, None, dace.Memlet(f"{target}[{index}]", wcr="lambda x, y: x + y"))
        return
    add_top_level_map(
        state,
        f"add_{sums}",
        {name: f"0:{sizes[i]}" for i, name in zip(kept, names)},
        {"__in": dace.Memlet(f"{sums}[{', '.join(names)}]")},
        "__out = __in",
        {"__out": dace.Memlet(f"{target}[{index}]", wcr="lambda x, y: x + y")},
        input_nodes={sums: sums_node},
        output_nodes={target: edge.dst},
    )
