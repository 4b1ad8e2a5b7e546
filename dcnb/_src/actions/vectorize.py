"""vectorization: DaCe's Vectorization where it gives code that compiles and computes what the scalar code does.

DaCe's transformation matches far more maps than it handles: it splits a remainder off into a map that matches
again, loads rows through aligned vector pointers whatever their alignment, and leaves GCC to convert between
vectors and scalars where it cannot. A match is taken here only where none of that can happen, with the widest
vector width that fits.
"""

from __future__ import annotations

import ast
import copy
import math

import dace
import numpy
from dace.properties import CodeBlock
from dace.sdfg import nodes
from dace.transformation import PatternTransformation
from dace.transformation.dataflow import Vectorization
from dace.transformation.dataflow.tasklet_fusion import PythonConnectorRenamer

from .. import dace_internals
from ..passes import tasklet_code, vecmath
from . import matching
from .matching import Where


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
        for match in matching.matches(Vectorization, sdfg, where, {"vector_len": width}):
            if id(match.map_entry) not in seen and _whole(match):
                seen.add(id(match.map_entry))
                yield match


def _whole(match: Vectorization) -> bool:
    """Whether the match vectorizes its map whole, with right code, at its own width."""
    return _fits(match, match.vector_len) and _vector_safe(match, match.vector_len)


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
    state = dace_internals.match_state(match)
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
    state = dace_internals.match_state(match)
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
        if subset.num_elements() != 1:
            # gap: DaCe's Vectorization turns away connectors typed pointers only, and an autodiff tasklet's are
            # untyped: a Gather's backward ``__data_gradient[idx] = ...`` into ``x[i0, 0:17, i1]`` got a vector
            # range in its last dimension, a memlet of one more dimension than its code's subscript (ViT, BERT)
            return False  # a connector that is an array, subscripted in the code
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
    # GCC does not convert vectors of floats to doubles; gap: DaCe's runtime (vector.h) has vector types of
    # integers, float32 and float64 only: a copy of bools (BERT's mask broadcast after expand) did not compile
    return vector_inputs > 0 and len(types) == 1 and types.pop().type in VECTOR_TYPES


#: element types DaCe's runtime has vector types of
VECTOR_TYPES = {
    numpy.int8, numpy.int16, numpy.int32, numpy.int64, numpy.uint8, numpy.uint16, numpy.uint32, numpy.uint64,
    numpy.float32, numpy.float64,
}


#: functions with vector versions that compute what the scalar ones do (DaCe's runtime and vecmath.h); DaCe's
#: ``heaviside`` compiles for vectors but returns the comparison's bits reinterpreted as floats
VECTOR_FUNCTIONS = {
    "exp", "exp2", "expm1", "log", "log1p", "log2", "tanh", "sinh", "cosh", "sin", "cos", "atan", "erf", "erfc",
    "sqrt", "abs", "fabs", "floor", "ceil", "round", "min", "max", "fmin", "fmax", "pow", "ipow",
}


def _calls(code: list) -> set[str]:
    """Names of the functions a Python tasklet calls, casts to DaCe types (``dace.float32(1)``) and constants made
    floats (``float(1)``, a scalar the vector arithmetic broadcasts) left out."""
    names = set()
    for node in (n for statement in code for n in ast.walk(statement)):
        if isinstance(node, ast.Call):
            func = node.func
            if tasklet_code.dace_type(func) is not None:
                continue
            if isinstance(func, ast.Name) and func.id == "float" and all(isinstance(a, ast.Constant) for a in node.args):
                continue
            names.add(func.id if isinstance(func, ast.Name) else ast.unparse(func))
    return names


def count(sdfg: dace.SDFG, where: Where, options: dict) -> int:
    return len(places(sdfg, where, options))


def places(sdfg: dace.SDFG, where: Where, options: dict) -> list[nodes.MapEntry]:
    """The maps it would vectorize, each by its entry (in ``sdfg``: found in a copy whose maps' tasklets are
    merged, which keeps the entries' guids)."""
    merged = copy.deepcopy(sdfg)
    merge_tasklets(merged, where)
    guids = {match.map_entry.guid for match in _vectorizable(merged, where, options)}
    return [n for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nodes.MapEntry) and n.guid in guids]


def apply(sdfg: dace.SDFG, where: Where, options: dict) -> int:
    # the vector overloads of the math functions come with every CPU build (passes.CPU_BUILD installs vecmath.h);
    # the runner passes 64-byte aligned arrays (module.py)
    merge_tasklets(sdfg, where)
    return matching.apply_in_rounds_then_propagate(
        sdfg,
        lambda: _vectorizable(sdfg, where, options),
        lambda match: matching.touches(match, where) and _whole(match),
        before=_type_constants,
        after=_whole_rows,
    )


def _whole_rows(match: Vectorization) -> None:
    """End the vectorized map's last dimension at the last element its last vector reads (``0:64:8``, not
    ``0:57:8``): the same iterations, whose memlets then propagate to the whole row.

    gap: DaCe's Vectorization ends the range at its last vector's first element, and DaCe's propagation of
    ``i:i+8`` over ``b:e:8`` ends at ``e``: a row of 64 propagated as ``0:57``, which a map fusion afterwards
    (fuse_rows) took for the size of the transient it passes values in and for the part of a row it stores (the
    last 7 elements of each row of a value kept for the backward never written: the Llama layer's and ConvNeXt's
    results and gradients off by up to inf)."""
    ranges = match.map_entry.map.range
    first, last, step = ranges[-1]
    ranges[-1] = (first, last + step - 1, step)


def _type_constants(match: Vectorization) -> None:
    """Write each float constant of the map's tasklet that its arrays' type cannot hold exactly as a constant of
    that type (``dace.float32(1e-05)``).

    gap: DaCe's Vectorization leaves Python's float constants doubles, and GCC converts no double to a vector of
    floats that would lose digits: a BatchNorm's ``1.0 / sqrt(x + 1e-05)`` after auto_optimize did not compile."""
    state = dace_internals.match_state(match)
    tasklet = state.successors(match.map_entry)[0]
    dtype = next(state.sdfg.arrays[e.data.data].dtype for e in state.out_edges(tasklet) if e.data.data is not None)
    if dtype.type not in (numpy.float32, numpy.float16):
        return
    typing = _TypedConstants(dtype)
    tree = typing.visit(ast.parse(tasklet.code.as_string))
    if typing.typed:  # code left as it was keeps its text (and the build's key)
        tasklet.code = CodeBlock(ast.unparse(tree), dace.Language.Python)


class _TypedConstants(ast.NodeTransformer):
    """Float constants the type cannot hold exactly made constants of that type (``typed``: how many); those
    already typed left."""

    def __init__(self, dtype) -> None:
        self.dtype = dtype
        self.typed = 0

    def visit_Call(self, node: ast.Call) -> ast.AST:
        return node if tasklet_code.dace_type(node.func) is not None else self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if not _inexact(node.value, self.dtype):
            return node
        self.typed += 1
        return tasklet_code.typed(node.value, self.dtype)


def _inexact(value: object, dtype) -> bool:
    """A finite float that ``dtype`` holds only rounded."""
    return isinstance(value, float) and math.isfinite(value) and float(dtype.type(value)) != value


def merge_tasklets(sdfg: dace.SDFG, where: Where) -> int:
    """Make each innermost map whose body is tasklets passing values through transients of one element a map of
    one tasklet that computes them in order, each passed value a local of its code; returns how many maps.

    gap: DaCe's Vectorization takes maps of one tasklet only. auto_optimize's fusion leaves a SiLU as a map of two,
    its sigmoid stored for the backward and passed to the product (EfficientNet-B0's forward spent 12.9 ms of
    150 in those maps, scalar, where eager's silu is vectorized), and DaCe's TaskletFusion merges no value that
    is also stored."""
    merged = 0
    for state in [s for g in sdfg.all_sdfgs_recursive() for s in g.states()]:
        for entry in [n for n in state.nodes() if isinstance(n, nodes.MapEntry)]:
            if where is not None and matching.label(entry) not in where:
                continue
            order = _chain(state, entry)
            if order is not None:
                _merge(state, entry, order)
                merged += 1
    return merged


def _chain(state: dace.SDFGState, entry: nodes.MapEntry) -> list[nodes.Tasklet] | None:
    """The tasklets of a map body that holds only Python tasklets and one-element transients each written once
    (no sum), in an order each is computed after what it reads; None for any other body or a single tasklet."""
    subgraph = state.scope_subgraph(entry, include_entry=False, include_exit=False)
    body = subgraph.nodes()
    tasklets = [n for n in body if isinstance(n, nodes.Tasklet)]
    if len(tasklets) < 2 or any(t.code.language != dace.Language.Python for t in tasklets):
        return None
    for node in body:
        if isinstance(node, nodes.Tasklet):
            continue
        if not isinstance(node, nodes.AccessNode):
            return None
        desc = state.sdfg.arrays[node.data]
        if not desc.transient or desc.total_size != 1 or state.in_degree(node) != 1:
            return None
        (write,) = state.in_edges(node)
        if not isinstance(write.src, nodes.Tasklet) or write.data.wcr is not None:
            return None
        if any(e.data.wcr is not None for e in state.out_edges(node)):
            return None
    if any(e.data.wcr is not None or e.data.dynamic for t in tasklets for e in state.all_edges(t)):
        return None
    return [n for n in dace.sdfg.utils.dfs_topological_sort(subgraph) if isinstance(n, nodes.Tasklet)]


def _merge(state: dace.SDFGState, entry: nodes.MapEntry, order: list[nodes.Tasklet]) -> nodes.Tasklet:
    """One tasklet in place of ``order``'s, inputs and outputs kept, each passed value a local."""
    exit_node = state.exit_node(entry)
    inputs, outputs, code = {}, {}, []
    local = {}  # one-element transient -> the local holding its value
    # the access nodes the values pass through: this map's own (another map of the state may pass values through
    # a transient of the same name)
    passed = []
    edges_in, edges_out = [], []  # (connector, edge) to re-attach
    for k, tasklet in enumerate(order):
        renamed = {}
        for e in state.in_edges(tasklet):
            if e.dst_conn is None:
                continue
            if isinstance(e.src, nodes.AccessNode) and e.src.data in local:
                renamed[e.dst_conn] = local[e.src.data]
            else:
                renamed[e.dst_conn] = f"__t{k}{e.dst_conn}"
                inputs[renamed[e.dst_conn]] = tasklet.in_connectors[e.dst_conn]
                edges_in.append((renamed[e.dst_conn], e))
        for e in state.out_edges(tasklet):
            if isinstance(e.dst, nodes.AccessNode):
                local[e.dst.data] = renamed[e.src_conn] = f"__v{len(local)}"
                passed.append(e.dst)
            else:
                renamed[e.src_conn] = f"__t{k}{e.src_conn}"
                outputs[renamed[e.src_conn]] = tasklet.out_connectors[e.src_conn]
                edges_out.append((renamed[e.src_conn], e))
        renamer = PythonConnectorRenamer(renamed)
        code += [ast.unparse(renamer.visit(copy.deepcopy(statement))) for statement in tasklet.code.code]
    # a passed value that also leaves the map (stored for the backward) is an output of its own
    stored = []
    for node in passed:
        for e in state.out_edges(node):
            if e.dst is exit_node:
                name = f"__s{len(stored)}"
                code.append(f"{name} = {local[node.data]}")
                outputs[name] = state.sdfg.arrays[node.data].dtype
                stored.append((name, node, e))
    merged = state.add_tasklet("_".join(t.label for t in order), inputs, outputs, "\n".join(code))
    for name, e in edges_in:
        state.add_edge(e.src, e.src_conn, merged, name, copy.deepcopy(e.data))
    if not edges_in:  # tasklets that read nothing (accumulators' resets) sit in the map by an empty memlet
        state.add_nedge(entry, merged, dace.Memlet())
    for name, e in edges_out:
        state.add_edge(merged, name, e.dst, e.dst_conn, copy.deepcopy(e.data))
    for name, node, e in stored:
        # the edge names the passed value's array, the element it writes out being its other subset
        outer = state.memlet_path(e)[-1]
        state.add_edge(merged, name, e.dst, e.dst_conn, dace.Memlet(data=outer.data.data, subset=e.data.dst_subset))
    state.remove_nodes_from([*order, *passed])
    for name in local:
        if not any(isinstance(n, nodes.AccessNode) and n.data == name for n, _ in state.sdfg.all_nodes_recursive()):
            state.sdfg.remove_data(name, validate=False)
    return merged

