"""Cheap values that several tasklets of one map read, computed once for each reader, so that tasklet fusion merges
every chain of the map into one expression.

gap: DaCe's TaskletFusion merges a tasklet into the one that reads its value only where that is the value's only
reader. A value read twice stays an intermediate inside the fused map, and DaCe's autodiff cannot store one for the
backward: a Linear's bias add feeding GELU (``h * (1 + erf(h / sqrt 2)) / 2`` reads ``h`` twice) made tasklet_fusion
fail on every transformer layer. Recomputing an addition or a product per reader costs less than the array it would
otherwise store; values with function calls (``erf``, ``exp``) are left as they are. Once merged, the copies'
inputs are joined (``join_inputs``): each tasklet reads an element through one connector.
"""

from __future__ import annotations

import ast

import dace
from dace.properties import CodeBlock
from dace.sdfg import nodes
from dace.transformation.dataflow.tasklet_fusion import PythonConnectorRenamer

from ..passes import tasklet_code


def split(sdfg: dace.SDFG) -> int:
    """Give each tasklet reader of a cheap shared value inside a map its own copy of the tasklet computing it, in
    ``sdfg`` and its nested SDFGs; returns how many copies were made."""
    made, fresh = 0, True
    while fresh:  # a copy may write one of MapFusion's copies of the value, itself read twice
        fresh = 0
        for nested in sdfg.all_sdfgs_recursive():
            for state in nested.states():
                for tasklet in [n for n in state.nodes() if isinstance(n, nodes.Tasklet)]:
                    value = _shared_value(nested, state, tasklet)
                    if value is not None:
                        fresh += _copy_per_reader(nested, state, tasklet, value)
        made += fresh
    return made


def join_inputs(sdfg: dace.SDFG) -> int:
    """Read each element once in each tasklet inside a map: connectors of a tasklet that read the same element
    become one; returns how many went.

    gap: once tasklet fusion merged the copies ``split`` made, the tasklet reads the product through one connector
    per copy, and DaCe's autodiff gives each connector a gradient of its own, added into the product's gradient
    with a write-conflict resolution: zeroed first, then added into twice (0.25 ms and two passes over the array
    on the BERT-mini layer's feed-forward).
    """
    joined = 0
    for nested in sdfg.all_sdfgs_recursive():
        for state in nested.states():
            for tasklet in [n for n in state.nodes() if isinstance(n, nodes.Tasklet)]:
                if tasklet.language != dace.Language.Python or state.entry_node(tasklet) is None:
                    continue
                kept: dict[tuple, str] = {}
                renamed: dict[str, str] = {}
                for edge in list(state.in_edges(tasklet)):
                    memlet = edge.data
                    if memlet.data is None or memlet.dynamic or memlet.wcr is not None:
                        continue
                    source = state.memlet_path(edge)[0].src
                    key = (source, memlet.data, str(memlet.subset))
                    if key not in kept:
                        kept[key] = edge.dst_conn
                        continue
                    renamed[edge.dst_conn] = kept[key]
                    state.remove_memlet_path(edge)
                    tasklet.remove_in_connector(edge.dst_conn)
                if renamed:
                    code = PythonConnectorRenamer(renamed).visit(ast.parse(tasklet.code.as_string))
                    tasklet.code = CodeBlock(ast.unparse(code), dace.Language.Python)
                    joined += len(renamed)
    return joined


def _shared_value(sdfg: dace.SDFG, state: dace.SDFGState, tasklet: nodes.Tasklet) -> nodes.AccessNode | None:
    """The scalar ``tasklet`` writes, where it is cheap, reads only arrays through its map's entry, and its value
    is read by two or more tasklets or scalars (MapFusion's copies of it) of the same map, and by nothing else."""
    entry = state.entry_node(tasklet)
    if entry is None or not _cheap(tasklet) or state.out_degree(tasklet) != 1:
        return None
    # only values computed from what the map reads: a copy then adds no reader to another value of the map
    if any(e.src is not entry for e in state.in_edges(tasklet)):
        return None
    value = state.out_edges(tasklet)[0].dst
    if not _scalar_once(sdfg, state, value) or state.out_degree(value) < 2:
        return None
    for read in state.out_edges(value):
        if state.entry_node(read.dst) is not entry:
            return None
        if not isinstance(read.dst, nodes.Tasklet) and not _scalar_once(sdfg, state, read.dst):
            return None
    return value


def _scalar_once(sdfg: dace.SDFG, state: dace.SDFGState, node: nodes.Node) -> bool:
    """Whether ``node`` is a transient scalar written once, in its only access node of ``sdfg``."""
    if not isinstance(node, nodes.AccessNode) or state.in_degree(node) != 1:
        return False
    desc = sdfg.arrays[node.data]
    if not desc.transient or desc.total_size != 1:
        return False
    used = sum(1 for s in sdfg.states() for n in s.data_nodes() if n.data == node.data)
    used += sum(1 for e in sdfg.all_interstate_edges() if node.data in e.data.free_symbols)
    return used == 1


def _cheap(tasklet: nodes.Tasklet) -> bool:
    """Whether ``tasklet`` is one Python assignment of arithmetic on its inputs and constants (casts of constants
    such as ``dace.float32(1)`` included), with no other call."""
    if tasklet.language != dace.Language.Python or len(tasklet.code.code) != 1:
        return False
    [statement] = tasklet.code.code
    if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
        return False
    for node in ast.walk(statement.value):
        if isinstance(node, ast.Call) and not _constant_cast(node):
            return False
    return True


def _constant_cast(call: ast.Call) -> bool:
    return tasklet_code.dace_type(call.func) is not None and all(isinstance(a, ast.Constant) for a in call.args)


def _copy_per_reader(
    sdfg: dace.SDFG, state: dace.SDFGState, tasklet: nodes.Tasklet, value: nodes.AccessNode
) -> int:
    [write] = state.out_edges(tasklet)
    extra = state.out_edges(value)[1:]
    for read in extra:
        own = state.add_tasklet(
            tasklet.label, tasklet.in_connectors, tasklet.out_connectors, tasklet.code.as_string, tasklet.language
        )
        for edge in state.in_edges(tasklet):
            state.add_edge(edge.src, edge.src_conn, own, edge.dst_conn, dace.Memlet.from_memlet(edge.data))
        if isinstance(read.dst, nodes.AccessNode):  # a scalar copy of the value: written by the copy directly
            scalar = read.dst
        else:
            name = sdfg.add_datadesc(value.data, sdfg.arrays[value.data].clone(), find_new_name=True)
            scalar = state.add_access(name)
            state.add_edge(scalar, None, read.dst, read.dst_conn, dace.Memlet(data=name, subset="0"))
        state.add_edge(own, write.src_conn, scalar, None, dace.Memlet(data=scalar.data, subset="0"))
        state.remove_edge(read)
    return len(extra)
