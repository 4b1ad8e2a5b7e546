"""simplify_algebra's rewriting rules: Python tasklet code read as sympy expressions, and the forms with one exp
("exp", the plain rational one, and "split", the range-split one: see algebra.py) written back as tasklet code."""

from __future__ import annotations

import ast
import dataclasses
import functools
import math
from collections.abc import Callable

import sympy as sp

from ..passes import tasklet_code

#: calls that cost a libm (or libmvec) evaluation; arithmetic, abs and sqrt are cheap next to them
TRANSCENDENTAL = frozenset(
    "exp exp2 expm1 log log2 log10 log1p tanh sinh cosh tan sin cos atan asin acos erf erfc pow".split()
)
#: the float types of tasklet code, by their names in it (dace.float32)
FLOATS = ("float32", "float64")

_SYMPY: dict[str, Callable[..., sp.Expr]] = {
    "exp": sp.exp,
    "log": sp.log,
    "log1p": lambda a: sp.log(1 + a),
    "expm1": lambda a: sp.exp(a) - 1,
    "tanh": sp.tanh,
    "sinh": sp.sinh,
    "cosh": sp.cosh,
    "sqrt": sp.sqrt,
    "abs": sp.Abs,
    "erf": sp.erf,
}
#: integers written as C++ int literals (larger ones become float constants: exact in float32 up to 2^24)
_EXACT_INTEGERS = 1 << 24
#: rationals written as p / q when both are this small (x / 2); others become one float constant
_SMALL = 64


class Unsupported(Exception):
    """The tasklet's code is outside what simplify_algebra reads (it is left as it is)."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    form: str
    code: str
    calls: int


# --- reading tasklet code -------------------------------------------------------------------------------------


def statements(code: str) -> list[tuple[str, ast.expr]]:
    """The assignments of Python tasklet code: (target, value) for each."""
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        raise Unsupported(f"not Python: {e}") from e
    result = []
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            raise Unsupported(f"only assignments to names are read, not {ast.unparse(stmt)!r}")
        result.append((stmt.targets[0].id, stmt.value))
    return result


def _constant(node: ast.expr) -> float | int | None:
    """A numeric literal, also inside a float cast (dace.float32(1), float(1)), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _constant(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Call) and len(node.args) == 1 and cast(node.func) is not None:
        inner = _constant(node.args[0])
        return None if inner is None else float(inner)
    return None


def cast(func: ast.expr) -> str | None:
    """float32 / float64 for dace.float32, dace.float64 and float (C++ float), else None."""
    dtype = tasklet_code.dace_type(func)
    if dtype is not None:
        return dtype if dtype in FLOATS else None
    if isinstance(func, ast.Name) and func.id == "float":
        return "float32"
    return None


def to_sympy(code: str, inputs: tuple[str, ...]) -> dict[str, sp.Expr]:
    """The outputs of Python tasklet code as sympy expressions of its inputs (temporaries substituted)."""
    env: dict[str, sp.Expr] = {name: sp.Symbol(name, real=True) for name in inputs}
    outputs = {}
    for target, value in statements(code):
        env[target] = outputs[target] = _expr(value, env)
    return outputs


def _expr(node: ast.expr, env: dict[str, sp.Expr]) -> sp.Expr:
    value = _constant(node)
    if value is not None:
        return sp.Rational(repr(value)) if isinstance(value, float) else sp.Integer(value)
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, ast.BinOp):
        a, b = _expr(node.left, env), _expr(node.right, env)
        ops = {ast.Add: sp.Add, ast.Sub: lambda a, b: a - b, ast.Mult: sp.Mul, ast.Div: lambda a, b: a / b}
        if type(node.op) in ops:
            return ops[type(node.op)](a, b)
        if isinstance(node.op, ast.Pow):
            return a**b
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        a = _expr(node.operand, env)
        return -a if isinstance(node.op, ast.USub) else a
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _SYMPY and not node.keywords:
        return _SYMPY[node.func.id](*(_expr(a, env) for a in node.args))
    raise Unsupported(f"cannot read {ast.unparse(node)!r}")


def calls(code: str) -> int:
    """Transcendental calls the code makes per evaluation."""
    return sum(
        1
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in TRANSCENDENTAL
    )


# --- writing candidates -------------------------------------------------------------------------------------------


def _exp_atoms(exprs: list[sp.Expr]) -> tuple[sp.Expr, dict[sp.Expr, int]] | None:
    """(g, {exp(k*g): k}) when every exp in ``exprs`` is exp of an integer multiple of one argument g."""
    atoms = sorted(set().union(*(e.atoms(sp.exp) for e in exprs)), key=sp.default_sort_key)
    if not atoms:
        return None
    first = atoms[0].args[0]
    ratios = [sp.cancel(a.args[0] / first) for a in atoms]
    if not all(r.is_Rational for r in ratios):
        return None
    lcm = math.lcm(*(int(r.q) for r in ratios))
    multiples = [int(r * lcm) for r in ratios]
    gcd = math.gcd(*multiples)
    base = sp.expand(first * gcd / lcm)
    return base, {atom: m // gcd for atom, m in zip(atoms, multiples)}


def candidates(
    code: str, inputs: tuple[str, ...], outputs: tuple[str, ...], dtype: str, form: str = "auto"
) -> list[Candidate]:
    """Rewrites of ``code`` computing its ``outputs`` with one exp, cheapest first (not yet checked for accuracy)."""
    if {"_e", "_t", "_c"} & {*inputs, *outputs}:
        raise Unsupported("its connectors use the names of our temporaries")
    values = to_sympy(code, inputs)
    names = list(outputs)
    exprs = [values[n].rewrite(sp.exp) for n in names]
    found = _exp_atoms(exprs)
    if found is None:
        return []
    base, atoms = found
    e = sp.Symbol("_e", positive=True)
    in_e = [x.xreplace({a: e**k for a, k in atoms.items()}) for x in exprs]
    if any(x.has(sp.exp) for x in in_e):
        return []
    constant = functools.partial(_constant_code, dtype=dtype)
    result = []
    if not all(x.is_rational_function(e) for x in in_e):
        if form in ("auto", "exp"):  # exp still shared, other calls stay
            lines = [f"_e = {_code(sp.exp(base), constant)}"]
            lines += [f"{n} = {_code(x, constant)}" for n, x in zip(names, in_e)]
            result.append(_candidate("exp", lines))
        return result
    sums = [_terms(x, e) for x in in_e]
    step = _power_gcd([r for terms in sums for r, _ in terms if r != 1], e)
    if step > 1:
        # tanh(z) is a function of exp(2z) alone: exponentiate 2z once rather than square exp(z)
        sums = [[(r.subs(e, e ** sp.Rational(1, step)), rest) for r, rest in terms] for terms in sums]
        base = sp.expand(base * step)
    if form in ("auto", "exp"):
        lines = [f"_e = {_code(sp.exp(base), constant)}"]
        lines += [f"{n} = {_sum(terms, lambda r: (r, r), e, constant)}" for n, terms in zip(names, sums)]
        result.append(_candidate("exp", lines))
    if form in ("auto", "split"):
        t = sp.Symbol("_t", positive=True)
        lines = [f"_t = {_code(sp.exp(-sp.Abs(base)), constant)}", f"_c = {_code(sp.Ge(base, 0), constant)}"]
        sides = lambda r: (sp.cancel(r.subs(e, 1 / t)), r.subs(e, t))
        lines += [f"{n} = {_sum(terms, sides, t, constant)}" for n, terms in zip(names, sums)]
        result.append(_candidate("split", lines))
    return sorted(result, key=lambda c: (c.calls, len(c.code)))


def _power_gcd(exprs: list[sp.Expr], var: sp.Symbol) -> int:
    """The gcd of the powers of ``var`` in rational functions of it."""
    powers = [
        m[0] for x in exprs for part in sp.fraction(x) for m in sp.Poly(part, var).monoms() if m[0] != 0
    ]
    return math.gcd(*powers) if powers else 1


def _candidate(form: str, lines: list[str]) -> Candidate:
    code = "\n".join(lines)
    return Candidate(form, code, calls(code))


def _terms(expr: sp.Expr, e: sp.Symbol) -> list[tuple[sp.Expr, list[sp.Expr]]]:
    """``expr`` as a sum of terms r * f1 * f2 * ..., with r rational in e (cancelled) and the f free of e."""
    terms = []
    for term in sp.Add.make_args(expr):
        factors = sp.Mul.make_args(term)
        rational = sp.cancel(sp.Mul(*(f for f in factors if f.has(e))))
        terms.append((rational, [f for f in factors if not f.has(e)]))
    return terms


def _sum(terms, sides, var: sp.Symbol, constant) -> str:
    """Code for a sum of ``_terms``: each term's rational part becomes one quotient of polynomials (in ``var``, on
    each side of the split as ``sides`` maps it), computed first and then multiplied by the term's other factors
    in their original order. Like the original code, this multiplies a vanishing tanh'(z) into x * dz/dx rather
    than expanding x * dz/dx into a polynomial that overflows before the zero can cancel it."""
    texts = []
    for rational, rest in terms:
        if rational == 1:
            texts.append(_code(sp.Mul(*rest), constant))
            continue
        up, down = (_quotient_parts(side, var) for side in sides(rational))
        text = _select(up[0], down[0], constant)
        den = _select(up[1], down[1], constant)
        if den != "1":
            text = f"({text} / {den})"
        for factor in rest:
            text = f"({text} * {_code(factor, constant)})"
        texts.append(text)
    return texts[0] if len(texts) == 1 else f"({' + '.join(texts)})"


def _quotient_parts(expr: sp.Expr, var: sp.Symbol) -> tuple[sp.Expr, sp.Expr]:
    """(numerator, denominator) of ``expr`` cancelled, each polynomial factor in Horner form in ``var``."""
    num, den = sp.fraction(expr)
    return _horner_factors(sp.factor(num, var), var), _horner_factors(sp.factor(den, var), var)


def _select(up: sp.Expr, down: sp.Expr, constant) -> str:
    a, b = _code(up, constant), _code(down, constant)
    return a if a == b else f"({a} if _c else {b})"


def _horner_factors(expr: sp.Expr, var: sp.Symbol) -> sp.Expr:
    factors = sp.Mul.make_args(expr)
    out = []
    for f in factors:
        base, power = f.as_base_exp()
        if base.is_polynomial(var) and base.has(var) and sp.degree(base, var) > 1:
            base = sp.horner(sp.expand(base), wrt=var)
        out.append(sp.Pow(base, power, evaluate=False) if power != 1 else base)
    return sp.Mul(*out, evaluate=False)


def _constant_code(value: sp.Expr, dtype: str) -> str:
    # a bare float literal is a double in C++ and would promote float code to double
    return f"dace.{dtype}({float(value)!r})"


def _code(e: sp.Expr, constant: Callable[[sp.Expr], str]) -> str:
    """Python tasklet code for a sympy expression (integers stay integers, other constants get the tasklet's type)."""
    if e.is_Symbol:
        return e.name
    if e.is_Integer and abs(e) <= _EXACT_INTEGERS:
        return str(int(e)) if e >= 0 else f"({int(e)})"
    if e.is_Rational or e.is_Float:
        return constant(e)
    if isinstance(e, sp.Add):
        terms = sorted(e.args, key=lambda a: (a.could_extract_minus_sign(), sp.default_sort_key(a)))
        text = _code(terms[0], constant)
        for term in terms[1:]:
            text += f" - {_code(-term, constant)}" if term.could_extract_minus_sign() else f" + {_code(term, constant)}"
        return f"({text})"
    if isinstance(e, sp.Mul):
        return _product(e, constant)
    if isinstance(e, sp.Pow):
        if e.exp == sp.Rational(1, 2):
            return f"sqrt({_code(e.base, constant)})"
        if e.exp.is_Integer and e.exp > 0:
            return f"({_code(e.base, constant)} ** {int(e.exp)})"
        return _product(e, constant)
    if isinstance(e, sp.Abs):
        return f"abs({_code(e.args[0], constant)})"
    if isinstance(e, sp.core.relational.Relational) and e.rel_op in (">=", ">", "<=", "<"):
        return f"({_code(e.lhs, constant)} {e.rel_op} {_code(e.rhs, constant)})"
    if isinstance(e, sp.Function) and e.func.__name__ in _SYMPY:
        return f"{e.func.__name__}({', '.join(_code(a, constant) for a in e.args)})"
    raise Unsupported(f"cannot write {e}")


def _product(e: sp.Expr, constant) -> str:
    num, den = [], []
    sign = ""
    for factor in sp.Mul.make_args(e):
        if factor.is_Number and factor < 0:
            sign, factor = ("" if sign else "-"), -factor
        if factor.is_Rational and not factor.is_Integer and max(factor.p, factor.q) <= _SMALL:
            if factor.p != 1:
                num.append(str(int(factor.p)))
            den.append(str(int(factor.q)))
        elif factor.is_Number:
            if factor != 1:
                num.append(_code(factor, constant))
        elif factor.is_Pow and factor.exp.is_Integer and factor.exp < 0:
            base = sp.Pow(factor.base, -factor.exp, evaluate=False) if factor.exp != -1 else factor.base
            den.append(_code(base, constant))
        else:
            num.append(_code(factor, constant))
    text = " * ".join(num) if num else "1"
    if den:
        # sympy folds integer quotients into Rationals, so one side here is a float expression: C++ divides in
        # floating point
        text = f"({text} / {' / '.join(den)})"
    return f"(-{text})" if sign else text
