"""After autodiff, on the forward and backward SDFGs it returns: fixes for what DaCe's autodiff generates."""

from __future__ import annotations

import ast
import collections
import math
import re
from collections.abc import Iterable

import dace
import networkx as nx
from dace import subsets
from dace.libraries.onnx.nodes.onnx_op import ONNXOp
from dace.properties import CodeBlock
from dace.sdfg import nodes
from dace.transformation.pass_pipeline import Pipeline
from dace.transformation.passes.dead_dataflow_elimination import DeadDataflowElimination

from . import tasklet_code
from . import gradient_writes
from .top_level import add_top_level_map


def drop_unread_gradients(sdfg: dace.SDFG) -> int:
    """Remove what nothing reads (DaCe's dead dataflow elimination); returns how many access nodes went.

    gap: autodiff also differentiates with respect to the constants of the forward (GELU's 0.5, 1 and sqrt(2), the
    attention's scale), which nobody asked for: each element of the tensor they multiply adds its share into one
    scalar with an atomic addition, and the threads contend for it (three maps, 30 ms each, of a BERT-mini layer's
    170 ms backward).
    """
    removed = Pipeline([DeadDataflowElimination()]).apply_pass(sdfg, {}) or {}
    dropped = removed.get(DeadDataflowElimination.__name__) or {}
    if dropped:
        _drop_dead_assignments(sdfg)
    return sum(len(names) for by_state in dropped.values() for names in by_state.values())


def _drop_dead_assignments(sdfg: dace.SDFG) -> None:
    """Remove the statements of Python tasklets that assign a name no connector takes and no later statement reads.

    gap: dead dataflow elimination takes a tasklet's unread output connector away but leaves the code computing it,
    now a local of the connector's scalar type: once the tasklet is vectorized, a vector is assigned to it and the
    code does not compile.
    """
    for node, _ in sdfg.all_nodes_recursive():
        if not isinstance(node, nodes.Tasklet) or node.code.language != dace.Language.Python:
            continue
        body = ast.parse(node.code.as_string).body
        kept = []
        for i, statement in enumerate(body):
            target = statement.targets[0] if isinstance(statement, ast.Assign) and len(statement.targets) == 1 else None
            if isinstance(target, ast.Name) and target.id not in node.out_connectors:
                later = {n.id for s in body[i + 1 :] for n in ast.walk(s) if isinstance(n, ast.Name)}
                if target.id not in later:
                    continue
            kept.append(statement)
        if len(kept) < len(body):
            node.code = CodeBlock(ast.unparse(ast.Module(kept, [])), dace.Language.Python)


def accumulate_nested_gradients(sdfg: dace.SDFG) -> int:
    """Make gradients written by nested SDFGs and library nodes add up; returns how many writes were rerouted.

    gap: autodiff sums the gradients of an array used twice with a write-conflict resolution on each edge into
    it, but a nested SDFG (what backward rules such as LayerNormalization's return) writes through a pointer and
    ignores it: ``x + LayerNorm(x)`` got only LayerNorm's share of x's gradient. Each such write now goes to a
    zeroed temporary that a map adds into the gradient. Where the node is the gradient's one writer and writes all
    of it, it writes there directly instead: no temporary, no zeroing, no pass adding it in (a full-size ResNet-50's
    backward spent 34 of its 400 ms copying its convolutions' and BatchNorms' input gradients so).
    """
    rerouted = 0
    # each write rerouted adds a temporary's access node, never asked about: the index holds for those that are
    writes = gradient_writes.Writes(sdfg)
    for state in sdfg.states():
        # the top level read once: each write rerouted changes the state, and DaCe's entry_node then walks all of it
        scope = state.scope_dict()
        for node in [n for n in state.nodes() if isinstance(n, (nodes.NestedSDFG, nodes.LibraryNode)) and not scope[n]]:
            for edge in list(state.out_edges(node)):
                if edge.data.wcr is None or not isinstance(edge.dst, nodes.AccessNode):
                    continue
                if _writes_all_alone(sdfg, writes, node, edge):
                    edge.data.wcr = None
                    edge.dst.setzero = False
                    continue
                target, subset = edge.data.data, edge.data.subset
                sizes = subset.size()
                dtype = sdfg.arrays[target].dtype
                # a temporary of the whole gradient is laid out as it (a rule's nested SDFG writes it with the
                # gradient's strides: channels-last images)
                whole = subset.covers(subsets.Range.from_array(sdfg.arrays[target]))
                strides = sdfg.arrays[target].strides if whole else None
                tmp, _ = sdfg.add_transient(f"{target}_part", sizes, dtype, strides=strides, find_new_name=True)
                tmp_node = state.add_access(tmp)
                # a rule may write only part of it (or add into it); an ONNX op, or a rule that writes all of it
                # (once its only writer writes instead of adding: into a fresh temporary, the same), needs no zeroing
                # (a map over the whole array per call: 0.3-0.5 ms each on the BERT-mini layer)
                if isinstance(node, nodes.NestedSDFG):
                    inner = gradient_writes.Writes(node.sdfg)
                    inner.write_once(edge.src_conn)
                tmp_node.setzero = not (
                    isinstance(node, ONNXOp) or isinstance(node, nodes.NestedSDFG) and inner.overwritten(edge.src_conn)
                )
                state.add_edge(node, edge.src_conn, tmp_node, None, dace.Memlet.from_array(tmp, sdfg.arrays[tmp]))
                params = [f"__a{i}" for i in range(len(sizes))]
                begins = [r[0] for r in subset.ndrange()]
                steps = [r[2] for r in subset.ndrange()]
                add_top_level_map(
                    state,
                    f"accumulate_{target}",
                    {p: f"0:{s}" for p, s in zip(params, sizes)},
                    {"__in": dace.Memlet(f"{tmp}[{', '.join(params)}]")},
                    "__out = __in",
                    {
                        "__out": dace.Memlet(
                            f"{target}[{', '.join(f'{b} + ({st}) * {p}' for b, st, p in zip(begins, steps, params))}]",
                            wcr="lambda x, y: x + y",
                        )
                    },
                    input_nodes={tmp: tmp_node},
                    output_nodes={target: edge.dst},
                )
                state.remove_edge(edge)
                rerouted += 1
    return rerouted


def _writes_all_alone(sdfg: dace.SDFG, writes: gradient_writes.Writes, node: nodes.Node, edge) -> bool:
    """Whether ``edge`` from ``node`` is the one write into its array, through the SDFG's one access node of it
    (read only after it), and ``node`` writes every element of it: an ONNX op, or a nested SDFG that does once its
    own only writer writes instead of adding."""
    if writes.sole_write(edge.data.data) != (edge.dst, edge):
        return False
    if not edge.data.subset.covers(dace.subsets.Range.from_array(sdfg.arrays[edge.data.data])):
        return False
    if isinstance(node, ONNXOp):
        return True
    if not isinstance(node, nodes.NestedSDFG):
        return False
    inner = gradient_writes.Writes(node.sdfg)
    inner.write_once(edge.src_conn)
    return inner.overwritten(edge.src_conn)


def _is_pi(node: ast.AST) -> bool:
    """``pi``, ``math.pi`` or ``dace.math.pi``, as sympy's printer and DaCe's cleaner write it."""
    if isinstance(node, ast.Name):
        return node.id == "pi"
    return isinstance(node, ast.Attribute) and node.attr == "pi" and isinstance(node.ctx, ast.Load)


class _NumericPi(ast.NodeTransformer):
    def __init__(self, dtype):
        self.dtype = dtype

    def visit(self, node: ast.AST) -> ast.AST:
        if _is_pi(node):
            return ast.copy_location(tasklet_code.typed(math.pi, self.dtype), node)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "sqrt" and len(node.args) == 1:
            if _is_pi(node.args[0]):  # a constant: no call left whose overload could depend on the type
                return ast.copy_location(tasklet_code.typed(math.sqrt(math.pi), self.dtype), node)
        return self.generic_visit(node)


def numeric_pi(sdfg: dace.SDFG) -> int:
    """Write the constant pi as a number in generated derivatives; returns how many tasklets changed.

    gap: the derivative of erf (GELU) is ``2*exp(-x**2)/sqrt(pi)``, which becomes C++ ``sqrt(dace::math::pi)``:
    pi is a typeless constant that converts to every float type, so the call is ambiguous and does not compile.
    """
    return tasklet_code.rewrite_python(sdfg, _NumericPi, _is_pi)


def _is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _is_sympy_min_max(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("Min", "Max")


class _FloatMinMax(ast.NodeTransformer):
    def __init__(self, dtype):
        self.dtype = dtype

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if not _is_sympy_min_max(node):
            return node
        args = [tasklet_code.typed(float(a.value), self.dtype) if _is_int(a) else a for a in node.args]
        name = node.func.id.lower()
        result = args[-1]
        for arg in reversed(args[:-1]):  # binary calls, the ones every type (vectors too) has
            result = ast.Call(ast.Name(name, ast.Load()), [arg, result], [])
        return ast.copy_location(result, node)


def float_min_max(sdfg: dace.SDFG) -> int:
    """Write sympy's ``Min``/``Max`` in derivatives as binary ``min``/``max`` of the tasklet's float type;
    returns how many tasklets changed.

    gap: sympy writes ``Min(1, x)`` with the constant first, and DaCe's C++ ``Min`` returns its first argument's
    type, so ``Min(1, 0.58)`` is 0: the derivative of hardsigmoid (and of any clamp) was 0 everywhere. (``Min``
    also has no overload for vectors, so such a derivative could not be vectorized.)
    """
    return tasklet_code.rewrite_python(sdfg, _FloatMinMax, _is_sympy_min_max)



def _is_float(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is float


def _is_typed(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and tasklet_code.dace_type(node.func) is not None


class _TypedFloats(ast.NodeTransformer):
    def __init__(self, dtype):
        self.dtype = dtype

    def visit_Call(self, node: ast.Call) -> ast.AST:
        return node if _is_typed(node) else self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.copy_location(tasklet_code.typed(node.value, self.dtype), node) if _is_float(node) else node


def typed_float_literals(sdfg: dace.SDFG) -> int:
    """Give the float literals of Python tasklets the tasklet's type; returns how many tasklets changed.

    gap: DaCe writes the constants of its own expansions as bare literals (a mean's ``x * 0.0555``), which are
    doubles in C++: once vectorization makes ``x`` a vector of floats, a double times it does not compile
    ("conversion of scalar 'double' to vector ... involves truncation").
    """
    return tasklet_code.rewrite_python(sdfg, _TypedFloats, _is_float)


def stable_state_labels(sdfg: dace.SDFG) -> int:
    """Name the states autodiff labels with a Python object's id by their order instead; returns how many.

    gap: DaCe's backward of a reduction (BatchNorm in training mode) names a state ``block_<id(node)>``, so the same
    module hashed differently in every process and its build was never found in the cache.
    """
    renamed = 0
    for g in sdfg.all_sdfgs_recursive():
        for i, state in enumerate(s for s in g.states() if re.fullmatch(r"block_\d{6,}", s.label)):
            state.label = f"block_autodiff_{i}"
            renamed += 1
    return renamed


def shared_gradients(sdfg: dace.SDFG) -> int:
    """Where a map copies a gradient whole into a temporary that nothing else writes, the temporary's readers read
    the gradient itself and the copy goes; returns how many copies went.

    gap: DaCe's autodiff gives each input of a sum its own gradient, filled by copying the sum's gradient (a
    residual connection's backward copies it twice per element; ResNet-50's backward spent 3% of its time in those
    copies), where eager PyTorch hands the one tensor to both."""
    copies = 0
    # how many access nodes each array has in the SDFG itself: a rewrite only renames or removes the two it joins
    accesses = collections.Counter(
        n.data for n, s in sdfg.all_nodes_recursive() if isinstance(n, nodes.AccessNode) and s.sdfg is sdfg
    )
    for state in list(sdfg.states()):
        for tasklet in [n for n in state.nodes() if isinstance(n, nodes.Tasklet)]:
            copied = _copied_outputs(sdfg, state, tasklet, accesses)
            for out, source in copied:
                _read_instead(state, tasklet, out, source)
            copies += len(copied)
    return copies


def _copied_outputs(sdfg: dace.SDFG, state: dace.SDFGState, tasklet: nodes.Tasklet, accesses: dict) -> list:
    """(output connector, the access node it copies from) for each output of ``tasklet`` that copies an input whole
    into a temporary written nowhere else, the input's array written nowhere after."""
    entry = state.entry_node(tasklet)
    if entry is None or state.entry_node(entry) is not None or tasklet.code.language != dace.Language.Python:
        return []
    if len(state.scope_subgraph(entry).nodes()) != 3:  # entry, tasklet, exit
        return []
    found = []
    for statement in tasklet.code.code:
        copied = _copy_of(statement)
        if copied is None or copied[0] not in tasklet.out_connectors or copied[1] not in tasklet.in_connectors:
            continue
        out, inp = copied
        writes = [e for e in state.out_edges(tasklet) if e.src_conn == out]
        reads = [e for e in state.in_edges(tasklet) if e.dst_conn == inp]
        if len(writes) != 1 or len(reads) != 1:
            continue
        write, read = writes[0], reads[0]
        written, source = state.memlet_path(write), state.memlet_path(read)
        target, origin = written[-1].dst, source[0].src
        if not (isinstance(target, nodes.AccessNode) and isinstance(origin, nodes.AccessNode)):
            continue
        if len(written) != 2 or len(source) != 2 or any(e.data.wcr is not None or e.data.dynamic for e in written):
            continue
        if _whole_elements(sdfg, entry, read.data, origin.data) and _whole_elements(sdfg, entry, write.data, target.data):
            if _copy_target(sdfg, state, target, origin, accesses):
                found.append((out, origin))
    return found


def _copy_of(statement: ast.AST) -> tuple[str, str] | None:
    """(target, source) where ``statement`` assigns a connector to another, as it is or times one."""
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
        return None
    target, value = statement.targets[0], statement.value
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult):
        one = [side for side in (value.left, value.right) if isinstance(side, ast.Constant) and side.value == 1]
        if one:
            value = value.right if one[0] is value.left else value.left
    if isinstance(target, ast.Name) and isinstance(value, ast.Name):
        return target.id, value.id
    return None


def _whole_elements(sdfg: dace.SDFG, entry: nodes.MapEntry, memlet, name: str) -> bool:
    """Whether ``memlet`` takes element (p0, p1, ...) of ``name`` at the map's parameters in order, and the map runs
    over all of the array."""
    if memlet.data != name or len(entry.map.params) != len(sdfg.arrays[name].shape):
        return False
    for param, (begin, end, _), rng, size in zip(
        entry.map.params, memlet.subset.ndrange(), entry.map.range.ndrange(), sdfg.arrays[name].shape
    ):
        if str(begin) != param or str(end) != param or rng != (0, size - 1, 1):
            return False
    return True


def _copy_target(
    sdfg: dace.SDFG, state: dace.SDFGState, target: nodes.AccessNode, origin: nodes.AccessNode, accesses: dict
) -> bool:
    """Whether ``target`` is a temporary of the shape and layout of ``origin``'s array, this its only access and
    its only write, and ``origin`` the only access of its array (so written before it is read, never after);
    ``accesses``: how many access nodes each array has."""
    copy, source = sdfg.arrays[target.data], sdfg.arrays[origin.data]
    if not copy.transient or target.setzero or state.in_degree(target) != 1 or target.data == origin.data:
        return False
    if (copy.shape, copy.strides, copy.dtype, type(copy)) != (source.shape, source.strides, source.dtype, type(source)):
        return False
    return accesses[target.data] == 1 and accesses[origin.data] == 1


def _read_instead(state: dace.SDFGState, tasklet: nodes.Tasklet, out: str, origin: nodes.AccessNode) -> None:
    """Drop ``tasklet``'s copy into ``out``'s array; its readers read ``origin``'s array instead, which takes the
    copy's name where it is a temporary: the readers (an op's backward) go on reading the gradient of their op's
    output, which is what the views name them by (a product's backward, not the bias add's)."""
    (write,) = [e for e in state.out_edges(tasklet) if e.src_conn == out]
    target = state.memlet_path(write)[-1].dst
    old, new = (origin.data, target.data) if state.sdfg.arrays[origin.data].transient else (target.data, origin.data)
    _drop_output(state, write)
    for edge in [*state.in_edges(origin), *state.out_edges(origin), *state.out_edges(target)]:
        for e in state.memlet_tree(edge):
            if e.data.data == old:
                e.data.data = new
    for edge in list(state.out_edges(target)):
        state.add_edge(origin, None, edge.dst, edge.dst_conn, edge.data)
        state.remove_edge(edge)
    origin.data = new
    state.remove_node(target)
    state.sdfg.remove_data(old, validate=False)


def _remove_scope(state: dace.SDFGState, entry: nodes.MapEntry) -> None:
    """Remove a map that writes nothing any more, and the edges into it."""
    # the exit, its edges gone, is no longer part of the scope's subgraph
    exits = [n for n in state.nodes() if isinstance(n, nodes.MapExit) and n.map is entry.map]
    scope = [*state.scope_subgraph(entry).nodes(), *exits]
    for node in scope:
        for edge in list(state.in_edges(node)):
            state.remove_edge(edge)
    state.remove_nodes_from(scope)


def copied_sums(sdfg: dace.SDFG) -> int:
    """Where a zeroed gradient accumulator is the sum of a whole copy of one gradient and a whole part of another,
    the map adding the part writes the sum, reading the copied gradient itself: no zeroing, no copy, no reading
    back what was added. Returns how many.

    gap: a residual connection's input gradient is the sum's gradient plus the branch's; autodiff zeroes an
    accumulator, adds a copy of the sum's gradient into it, and later adds the branch's part (three passes over
    it where eager PyTorch makes one sum)."""
    summed = 0
    # how many access nodes each array has: a rewrite adds none
    accesses = collections.Counter(n.data for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nodes.AccessNode))
    for state in list(sdfg.states()):
        for node in [n for n in state.data_nodes() if n.setzero and state.in_degree(n) == 2]:
            if not sdfg.arrays[node.data].transient or accesses[node.data] != 1:
                continue
            parts = [_whole_part(sdfg, state, e) for e in state.in_edges(node)]
            if None in parts:
                continue
            for (copy_, origin), (add, _) in (parts, parts[::-1]):
                # the part's map must not lead to the copied gradient: reading it there would close a cycle
                if origin is None or accesses[origin.data] != 1 or nx.has_path(state.nx, add.src, origin):
                    continue
                _sum_into(state, copy_, add, origin)
                node.setzero = False
                summed += 1
                break
    return summed


def _whole_part(sdfg: dace.SDFG, state: dace.SDFGState, edge):
    """For an edge adding into an accumulator from a map of one tasklet that writes each element once: (the
    tasklet's write, the access node it copies from where the value is a copy of an input else None); None where
    the edge is no such write."""
    path = state.memlet_path(edge)
    if len(path) != 2 or not isinstance(edge.src, nodes.MapExit) or any(e.data.wcr is None for e in path):
        return None
    write = path[0]
    tasklet, entry = write.src, state.entry_node(edge.src)
    if state.entry_node(entry) is not None or len(state.scope_subgraph(entry).nodes()) != 3:
        return None
    if not isinstance(tasklet, nodes.Tasklet) or tasklet.code.language != dace.Language.Python:
        return None
    if write.data.dynamic or not _whole_elements(sdfg, entry, write.data, edge.dst.data):
        return None
    for statement in tasklet.code.code:
        copied = _copy_of(statement)
        if copied is None or copied[0] != write.src_conn:
            continue
        reads = [e for e in state.in_edges(tasklet) if e.dst_conn == copied[1]]
        if len(reads) == 1:
            origin = state.memlet_path(reads[0])[0].src
            if isinstance(origin, nodes.AccessNode) and _whole_elements(sdfg, entry, reads[0].data, origin.data):
                source, target = sdfg.arrays[origin.data], sdfg.arrays[edge.dst.data]
                if (source.shape, source.strides, source.dtype) == (target.shape, target.strides, target.dtype):
                    return write, origin
    return write, None


def _sum_into(state: dace.SDFGState, copy_, add, origin: nodes.AccessNode) -> None:
    """Drop the copy ``copy_`` writes (its map too, where it writes nothing else); the tasklet ``add`` writes its
    value plus ``origin``'s element instead of adding into the accumulator."""
    tasklet, entry = add.src, state.entry_node(add.src)
    connector = "__copied"
    while connector in tasklet.in_connectors:
        connector += "_"
    index = ", ".join(entry.map.params)
    tasklet.add_in_connector(connector)
    state.add_memlet_path(origin, entry, tasklet, dst_conn=connector, memlet=dace.Memlet(f"{origin.data}[{index}]"))
    code = []
    for statement in tasklet.code.code:
        if isinstance(statement, ast.Assign) and _assigns(statement, add.src_conn):
            statement.value = ast.BinOp(statement.value, ast.Add(), ast.Name(connector, ast.Load()))
        code.append(ast.unparse(ast.fix_missing_locations(statement)))
    tasklet.code = CodeBlock("\n".join(code), dace.Language.Python)
    for e in state.memlet_path(add):
        e.data.wcr = None
    _drop_output(state, copy_)


def _assigns(statement: ast.Assign, name: str) -> bool:
    return len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name) and statement.targets[0].id == name


def _drop_output(state: dace.SDFGState, write) -> None:
    """Remove a tasklet's output (its statement, connectors and edges to the access node), and its map where the
    tasklet writes nothing else."""
    tasklet, outer = write.src, state.memlet_path(write)[-1]
    exit_node = outer.src
    state.remove_edge(write)
    state.remove_edge(outer)
    exit_node.remove_in_connector(write.dst_conn)
    exit_node.remove_out_connector(outer.src_conn)
    tasklet.remove_out_connector(write.src_conn)
    kept = [s for s in tasklet.code.code if not (isinstance(s, ast.Assign) and _assigns(s, write.src_conn))]
    tasklet.code = CodeBlock("\n".join(ast.unparse(s) for s in kept) or "pass", dace.Language.Python)
    if not tasklet.out_connectors:
        _remove_scope(state, state.entry_node(tasklet))


def constants_passed_again(
    forward: dace.SDFG, backward: dace.SDFG, forwarded: list[str], constants: Iterable[str]
) -> list[str]:
    """Give the backward each scalar constant of the model it reads as the forward gets it, an argument, where
    autodiff had the forward store it; returns ``forwarded`` with the constants named in place of their arrays.

    gap: DaCe's autodiff forwards a scalar through a one-element array (autodiff/torch.py): the forward copies it
    in, the backward copies it out. For a constant of the model (GELU's 0.5 and sqrt(2), the attention's scale),
    which dcnb passes to both binaries anyway (``module._constants``), that is a copy each way per call; on a GPU
    a copy from the host in the forward, and one to the host and a wait for it before the backward's kernels, which
    keeps both binaries out of CUDA graphs (``native._BLOCKING``).
    """
    constants = set(constants)
    result = []
    for name in forwarded:
        kept = _scalar_kept(forward, backward, name, constants)
        if kept is None:
            result.append(name)
            continue
        scalar, copies = kept
        for sdfg, state in copies:
            for node in list(state.data_nodes()):
                state.remove_node(node)
            sdfg.remove_data(name)
            _drop_empty_state(state)
        backward.arrays[scalar].transient = False
        result.append(scalar)
    return result


def _scalar_kept(
    forward: dace.SDFG, backward: dace.SDFG, name: str, constants: set[str]
) -> tuple[str, list[tuple[dace.SDFG, dace.SDFGState]]] | None:
    """Where ``name`` is the one-element array autodiff keeps a scalar constant in: the constant, and the state of
    each side holding nothing but its copy (the forward's from the constant, the backward's into its scalar)."""
    copies = []
    scalar = None
    for sdfg, reads in ((backward, True), (forward, False)):
        states = [s for s in sdfg.states() if any(n.data == name for n in s.data_nodes())]
        if len(states) != 1 or len(states[0].nodes()) != 2 or states[0].number_of_edges() != 1:
            return None
        (edge,) = states[0].edges()
        array, other = (edge.src, edge.dst) if reads else (edge.dst, edge.src)
        if not isinstance(other, nodes.AccessNode) or array.data != name or scalar not in (None, other.data):
            return None
        scalar = other.data
        copies.append((sdfg, states[0]))
    described = forward.arrays.get(scalar)
    if scalar not in constants or not isinstance(described, dace.data.Scalar) or described.transient:
        return None
    if not isinstance(backward.arrays.get(scalar), dace.data.Scalar):
        return None
    return scalar, copies


def _drop_empty_state(state: dace.SDFGState) -> None:
    """Take an empty state out of the chain of states it is in (unconditional edges, no assignments)."""
    graph = state.parent_graph
    ins, outs = graph.in_edges(state), graph.out_edges(state)
    if len(ins) > 1 or len(outs) > 1 or any(not e.data.is_unconditional() or e.data.assignments for e in ins + outs):
        return
    if ins and outs:
        graph.add_edge(ins[0].src, outs[0].dst, dace.InterstateEdge())
    graph.remove_node(state)
