"""simplify_algebra: rewrite a tasklet's arithmetic into an equivalent form with fewer transcendental calls.

Mish is x * tanh(log(1 + exp(x))): three transcendental calls per element, and its derivative as many. Written
in e = exp(x), both are rational functions of e (tanh(log(y)) = (y^2 - 1) / (y^2 + 1)), so one exp suffices
(PyTorch issue #75251). The plain rational form overflows, though: e^2 is inf for x > 44 in float32 and
inf / inf gives nan. So besides the plain form ("exp") we build a range-split one ("split"): with
t = exp(-|g|) <= 1, the expression is R(1/t) for g >= 0 and R(t) for g < 0, each cancelled to a quotient of
polynomials in t that cannot overflow. The same works for any expression whose transcendental calls are all
exp/tanh/sinh/cosh/log of such exps of one argument g times integers (SiLU, sigmoid, GELU-tanh, softplus-based
activations like Mish and Smish, and their derivatives).

Every candidate is guarded numerically before it is used: we evaluate the original code in float64 (the
reference) and both the original and the candidate code in the tasklet's precision, over a grid that reaches
where exp overflows and underflows and down to tiny |x|, and reject a candidate whose error exceeds the
original's (or a few ulps of the local magnitude) anywhere, or that gives nan or inf where the original does not.
The code that runs is exactly the code the guard evaluated.

This acts after autodiff, on the forward and the backward tasklets alike: the guard then checks each tasklet
that runs, and the backward keeps the range split, which DaCe's autodiff would not derive from a rewritten
forward (it cannot differentiate a conditional, and the derivative of the plain form overflows again).

The rewriting rules (the code read into sympy, the forms written back) are in algebra_rules.py; here are the
guard, the analysis of one tasklet, and the action on SDFGs.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator

import dace
import numpy as np
import sympy as sp
from dace import dtypes
from dace.properties import CodeBlock
from dace.sdfg import nodes

from ..errors import check
from ..names import readable
from .algebra_rules import Candidate, Unsupported, calls, candidates, cast, statements, to_sympy

FORMS = ("auto", "exp", "split")

#: accuracy guard: a candidate's error may reach this many float ulps of the local magnitude of the result ...
ULPS = 16
#: ... or this multiple of the original code's own error at the same point
VS_ORIGINAL = 2.0
#: points the guard evaluates (every combination of values of the tasklet's inputs)
GRID_POINTS = 250_000

_NUMPY: dict[str, Callable[..., np.ndarray]] = {
    "exp": np.exp,
    "log": np.log,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "tanh": np.tanh,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "sqrt": np.sqrt,
    "abs": np.abs,
    "erf": np.vectorize(math.erf, otypes=[np.float64]),
}
_FLOATS = {"float32": np.float32, "float64": np.float64}
_TYPES = {dace.float32: "float32", dace.float64: "float64"}


@dataclasses.dataclass(frozen=True)
class Analysis:
    """What simplify_algebra found for one tasklet's code."""

    calls: int
    #: the accepted rewrite, if any
    rewrite: Candidate | None
    #: (form, reason) for each candidate the accuracy guard rejected
    rejected: tuple[tuple[str, str], ...] = ()
    #: why there is no rewrite, when there is none
    reason: str | None = None


# --- running tasklet code on numpy arrays (the accuracy guard) ---------------------------------------------------


def evaluate(code: str, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run Python tasklet code on arrays with C++'s typing: a bare float literal is a double, as in the generated
    code, and dace.float32(c) / float(c) are float32."""
    env = dict(values)
    outputs = {}
    with np.errstate(all="ignore"):
        for target, value in statements(code):
            env[target] = outputs[target] = _run(value, env)
    return outputs


def _run(node: ast.expr, env: dict) -> np.ndarray:
    if isinstance(node, ast.Constant) and not isinstance(node.value, bool):
        return np.float64(node.value) if isinstance(node.value, float) else node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.Call) and cast(node.func) is not None:
        return _FLOATS[cast(node.func)](_run(node.args[0], env))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _NUMPY:
        return _NUMPY[node.func.id](*(_run(a, env) for a in node.args))
    if isinstance(node, ast.BinOp):
        a, b = _run(node.left, env), _run(node.right, env)
        ops = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.true_divide, ast.Pow: np.power}
        return ops[type(node.op)](a, b)
    if isinstance(node, ast.UnaryOp):
        a = _run(node.operand, env)
        return -a if isinstance(node.op, ast.USub) else a
    if isinstance(node, ast.IfExp):
        return np.where(_run(node.test, env), _run(node.body, env), _run(node.orelse, env))
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        a, b = _run(node.left, env), _run(node.comparators[0], env)
        ops = {ast.GtE: np.greater_equal, ast.Gt: np.greater, ast.LtE: np.less_equal, ast.Lt: np.less}
        return ops[type(node.ops[0])](a, b)
    raise Unsupported(f"cannot evaluate {ast.unparse(node)!r}")


def _grid(names: tuple[str, ...], dtype: str) -> dict[str, np.ndarray]:
    """Every combination of wide-ranging values: tiny |x|, both sides of where exp overflows, inf and nan."""
    top = 35 if dtype == "float32" else 300
    overflow = 88.72 if dtype == "float32" else 709.78
    magnitudes = np.concatenate(
        [
            np.logspace(-top, top, 141),
            np.linspace(0.01, 25.0, 160),
            overflow / 2 + np.array([-0.1, -0.01, 0.01, 0.1]),
            overflow + np.array([-0.5, -0.01, 0.01, 0.5, 5.0]),
        ]
    )
    finite = np.unique(np.concatenate([-magnitudes, [0.0], magnitudes]))
    per_input = max(9, int(GRID_POINTS ** (1 / max(len(names), 1))) - 3)
    if len(finite) > per_input:
        finite = finite[np.linspace(0, len(finite) - 1, per_input).round().astype(int)]
    axis = np.concatenate([finite, [np.inf, -np.inf, np.nan]]).astype(dtype)
    mesh = np.meshgrid(*([axis] * len(names)), indexing="ij") if names else []
    return dict(zip(names, mesh))


def guard(original: str, candidate: str, inputs: tuple[str, ...], outputs: tuple[str, ...], dtype: str) -> str | None:
    """None when ``candidate`` is as accurate as ``original`` everywhere on the grid; else the reason it is not.

    The reference is the original code in float64. That can be wrong itself (log(1 + exp(x)) is 0 for x < -37,
    exp(x) overflows for x > 709): where the candidate fails and the two float64 evaluations disagree, the exact
    value of the expression is computed with mpmath.
    """
    grid = _grid(inputs, dtype)
    wide = {name: v.astype(np.float64) for name, v in grid.items()}
    reference, alternative = evaluate(original, wide), evaluate(candidate, wide)
    before, after = evaluate(original, grid), evaluate(candidate, grid)
    exact = to_sympy(original, inputs)
    shape = _shape(grid)
    defined = np.logical_and.reduce([~np.isnan(v) for v in wide.values()]) if wide else np.True_
    for name in outputs:
        if name not in after:
            return f"it does not compute {name}"
        ref, alt, old, new = (
            np.broadcast_to(np.asarray(v[name], dtype=np.float64), shape).copy()
            for v in (reference, alternative, before, after)
        )
        old, new = _rounded(old, dtype), _rounded(new, dtype)
        bad = _badness(ref, old, new, dtype, defined)
        # where the two float64 evaluations disagree, the original's may be the wrong one: the points that fail
        # there (the worst of them: exact arithmetic is slow) are judged again against mpmath
        doubt = (bad > 1) & ~_agree(ref, alt)
        if doubt.any() and not ((bad > 1) & ~doubt).any():
            points = _worst(doubt, bad)
            ref[points] = _mpmath(exact[name], inputs, wide, points, dtype)
            recomputed = np.zeros(shape, dtype=bool)
            recomputed[points] = True
            bad = np.where(doubt & ~recomputed, 0.0, _badness(ref, old, new, dtype, defined))
        if (bad > 1).any():
            what = "gives" if np.isinf(bad).any() else "loses accuracy:"
            return _explain(what, name, bad >= bad.max(), grid, ref, new)
    return None


def _rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return values.astype(dtype).astype(np.float64)


def _agree(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        close = np.abs(a - b) <= 1e-9 * np.maximum(np.abs(a), np.abs(b)) + 1e-300
    return (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b)) | (np.isfinite(a) & np.isfinite(b) & close)


def _badness(ref: np.ndarray, old: np.ndarray, new: np.ndarray, dtype: str, defined: np.ndarray) -> np.ndarray:
    """Per point: the candidate's error over what it may have (> 1: too inaccurate; inf: nan or inf where the
    reference and the original code are finite, or of another kind). Where the exact value is undefined (0 / 0)
    but no input is nan, any value goes; a nan input must still give what the original gives."""
    eps, tiny = float(np.finfo(dtype).eps), float(np.finfo(dtype).tiny)
    ref32 = _rounded(ref, dtype)
    kind = lambda a, b: (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b)) | (np.isfinite(a) & np.isfinite(b))
    wrong_kind = ~(kind(new, ref32) | kind(new, old) | (np.isnan(ref) & defined))
    with np.errstate(all="ignore"):
        both = np.isfinite(new) & np.isfinite(ref)
        error = np.where(both, np.abs(new - ref), 0.0)
        error_old = np.where(np.isfinite(old) & np.isfinite(ref), np.abs(old - ref), np.inf)
        local = _local_magnitude(np.where(np.isfinite(ref), np.abs(ref), 0.0))
        allowed = np.maximum(ULPS * eps * local + tiny, VS_ORIGINAL * error_old)
        return np.where(wrong_kind, np.inf, error / allowed)


def _worst(mask: np.ndarray, badness: np.ndarray, most: int = 500) -> tuple[np.ndarray, ...]:
    """Indices of at most ``most`` points of ``mask``, the worst first, ties in a fixed random order (exact
    arithmetic is slow)."""
    flat = np.flatnonzero(mask)
    if len(flat) > most:
        flat = np.random.default_rng(0).permutation(flat)
        flat = flat[np.argsort(-badness.ravel()[flat], kind="stable")[:most]]
    return np.unravel_index(flat, mask.shape)


def _mpmath(expr: sp.Expr, inputs: tuple[str, ...], values: dict[str, np.ndarray], points, dtype: str) -> np.ndarray:
    import mpmath

    fn = sp.lambdify([sp.Symbol(n, real=True) for n in inputs], expr, modules="mpmath")
    columns = [values[n][points] for n in inputs]
    with mpmath.workdps(60 if dtype == "float32" else 400):
        out = []
        for args in zip(*columns):
            try:
                out.append(float(mpmath.re(fn(*(mpmath.mpf(float(a)) for a in args)))))
            except (ZeroDivisionError, OverflowError, ValueError):
                out.append(math.nan)
    return np.array(out, dtype=np.float64)


def _shape(grid: dict[str, np.ndarray]) -> tuple[int, ...]:
    return next(iter(grid.values())).shape if grid else ()


def _local_magnitude(magnitude: np.ndarray) -> np.ndarray:
    """The largest magnitude among each grid point's neighbours: the scale an error is judged against where the
    result itself crosses zero (a derivative's root, say)."""
    result = magnitude.copy()
    for axis in range(magnitude.ndim):
        for shift in (1, -1):
            result = np.maximum(result, np.roll(magnitude, shift, axis=axis))
    return result


def _explain(
    what: str, name: str, mask: np.ndarray, grid: dict[str, np.ndarray], ref: np.ndarray, new: np.ndarray
) -> str:
    at = tuple(int(i[0]) for i in np.nonzero(mask))
    point = ", ".join(f"{k}={float(v[at]):.4g}" for k, v in grid.items())
    return f"{what} {name} = {float(new[at]):.6g} at {point} where float64 gives {float(ref[at]):.6g}"


# --- analysis of one tasklet --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def analyze(code: str, inputs: tuple[str, ...], outputs: tuple[str, ...], dtype: str, form: str = "auto") -> Analysis:
    """The cheapest accurate rewrite of ``code`` (cached: counting and applying share the work)."""
    try:
        before = calls(code)
    except SyntaxError as e:
        return Analysis(0, None, reason=f"it is not Python: {e}")
    if before <= 1:
        return Analysis(before, None, reason="it makes at most one transcendental call")
    try:
        options = [c for c in candidates(code, inputs, outputs, dtype, form) if c.calls < before]
    except (Unsupported, sp.PolynomialError, ValueError, TypeError, RecursionError) as e:
        return Analysis(before, None, reason=f"it cannot be rewritten: {e}")
    if not options:
        return Analysis(before, None, reason="no form with fewer transcendental calls was found")
    rejected = []
    for option in options:
        problem = guard(code, option.code, inputs, outputs, dtype)
        if problem is None:
            return Analysis(before, option, tuple(rejected))
        rejected.append((option.form, problem))
    reasons = "; ".join(f"the {form} form {why}" for form, why in rejected)
    return Analysis(before, None, tuple(rejected), reason=f"every rewrite loses accuracy: {reasons}")


# --- on SDFGs -------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Site:
    tasklet: nodes.Tasklet
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dtype: str


def sites(sdfg: dace.SDFG, where) -> Iterator[Site]:
    """Python tasklets on scalars (or vectors) of one float type, with transcendental calls."""
    for node, state in sdfg.all_nodes_recursive():
        if not isinstance(node, nodes.Tasklet) or node.language != dtypes.Language.Python:
            continue
        if where is not None and node.label not in where:
            continue
        types = set()
        for edge in (*state.in_edges(node), *state.out_edges(node)):
            inward = edge.dst is node
            conn = edge.dst_conn if inward else edge.src_conn
            if conn is None or edge.data.data is None:
                continue
            ctype = (node.in_connectors if inward else node.out_connectors)[conn]
            dtype = state.sdfg.arrays[edge.data.data].dtype
            scalar = not isinstance(ctype, dtypes.pointer)
            types.add(_TYPES.get(dtype) if scalar else None)
        if len(types) != 1 or None in types:
            continue
        try:
            if calls(node.code.as_string) < 2:
                continue
        except SyntaxError:
            continue
        yield Site(node, tuple(sorted(node.in_connectors)), tuple(sorted(node.out_connectors)), types.pop())


def count(sdfg: dace.SDFG, where, options: dict) -> int:
    return len(places(sdfg, where, options))


def places(sdfg: dace.SDFG, where, options: dict) -> list[nodes.Tasklet]:
    """The tasklets it would rewrite."""
    return [site.tasklet for site in sites(sdfg, where) if _analysis(site, options).rewrite is not None]


def apply(sdfg: dace.SDFG, where, options: dict) -> int:
    applied = 0
    for site in list(sites(sdfg, where)):
        found = _analysis(site, options).rewrite
        if found is not None:
            site.tasklet.code = CodeBlock(found.code, dtypes.Language.Python)
            applied += 1
    return applied


def reasons(sdfg: dace.SDFG, where, options: dict) -> list[str]:
    """Why each tasklet with transcendental calls was left as it is."""
    found = list(sites(sdfg, where))
    if not found:
        return ["no tasklet makes more than one transcendental call (tasklet_fusion merges them first)"]
    left = [(site, a) for site in found if (a := _analysis(site, options)).rewrite is None]
    return [f"{readable(site.tasklet.label)}: {a.reason}" for site, a in left]


def _analysis(site: Site, options: dict) -> Analysis:
    form = options.get("form", "auto")
    check(form in FORMS, f"simplify_algebra's form must be one of {', '.join(FORMS)}, not {form!r}")
    return analyze(site.tasklet.code.as_string, site.inputs, site.outputs, site.dtype, form)
