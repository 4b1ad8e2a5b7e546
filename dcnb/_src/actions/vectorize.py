"""vectorization: DaCe's Vectorization where it gives code that compiles and computes what the scalar code does.

DaCe's transformation matches far more maps than it handles: it splits a remainder off into a map that matches
again, loads rows through aligned vector pointers whatever their alignment, and leaves GCC to convert between
vectors and scalars where it cannot. A match is taken here only where none of that can happen, with the widest
vector width that fits.
"""

from __future__ import annotations

import ast

import dace
from dace.sdfg import nodes
from dace.transformation import PatternTransformation
from dace.transformation.dataflow import Vectorization

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
            if tasklet_code.dace_type(func) is not None:
                continue
            names.add(func.id if isinstance(func, ast.Name) else ast.unparse(func))
    return names


def count(sdfg: dace.SDFG, where: Where, options: dict) -> int:
    return sum(1 for _ in _vectorizable(sdfg, where, options))


def places(sdfg: dace.SDFG, where: Where, options: dict) -> list[nodes.MapEntry]:
    """The maps it would vectorize, each by its entry."""
    return [match.map_entry for match in _vectorizable(sdfg, where, options)]


def apply(sdfg: dace.SDFG, where: Where, options: dict) -> int:
    # the vector overloads of the math functions come with every CPU build (passes.CPU_BUILD installs vecmath.h);
    # the runner passes 64-byte aligned arrays (module.py)
    return matching.apply_in_rounds_then_propagate(
        sdfg, lambda: _vectorizable(sdfg, where, options), lambda match: matching.touches(match, where) and _whole(match)
    )
