"""Reading and rewriting the code of tasklets: one place that knows how DaCe writes typed constants into Python
tasklets and symbols' values into C++ ones."""

from __future__ import annotations

import ast
import re

import dace
from dace.properties import CodeBlock
from dace.sdfg import nodes


def dace_type(func: ast.expr) -> str | None:
    """``float32`` for the callee ``dace.float32`` (how DaCe's autodiff and dcnb write typed constants), else None."""
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "dace":
        return func.attr
    return None


def rewrite_python(sdfg: dace.SDFG, transformer: type[ast.NodeTransformer], wanted) -> int:
    """Rewrite the code of every Python tasklet with a node ``wanted`` matches; returns how many changed.

    ``transformer`` is made with the tasklet's float type, so that the constants it writes keep the code in that
    type: a double in a float expression does not compile once the expression is vectorized.
    """
    changed = 0
    for node, state in sdfg.all_nodes_recursive():
        if not isinstance(node, nodes.Tasklet) or node.code.language != dace.Language.Python:
            continue
        tree = ast.parse(node.code.as_string)
        if not any(wanted(n) for n in ast.walk(tree)):
            continue
        dtype = next(
            (state.sdfg.arrays[e.data.data].dtype for e in state.out_edges(node) if e.data.data is not None),
            dace.float64,
        )
        node.code = CodeBlock(ast.unparse(transformer(dtype).visit(tree)), dace.Language.Python)
        changed += 1
    return changed


def typed(value: float, dtype) -> ast.expr:
    """``dace.float32(value)``: a constant of the tasklet's type, as DaCe's autodiff writes its constants."""
    return ast.Call(ast.Attribute(ast.Name("dace", ast.Load()), dtype.to_string(), ast.Load()), [ast.Constant(value)], [])


#: a line DaCe puts before a C++ tasklet's code for a symbol it replaced (sdfg/replace.py): ``auto M = 1024;``
_DECLARATION = re.compile(r"(?:[\w:]+ )+(?P<name>\w+) = (?P<value>[^;\n]*);\n")
#: what may make the order of two declarations matter beyond reading one another: a call, an increment
_EFFECT = re.compile(r"\w\s*\(|\+\+|--|=")


def declarations_in_order(sdfg: dace.SDFG) -> int:
    """Sort by name the symbol declarations that open a C++ tasklet's code, where none reads another or calls
    anything; returns the tasklets changed.

    gap: replacing symbols (inlining a nested SDFG, as after a Gemm's expansion) declares them in the order of a set
    of names, which changes from one Python process to the next: the same step's build key changed with each
    kernel, and its binary was built again. Declarations that read one another (DaCe's two-step replacement of
    symbols that swap) keep their order.
    """
    changed = 0
    for node, _ in sdfg.all_nodes_recursive():
        if not isinstance(node, nodes.Tasklet) or node.code.language != dace.Language.CPP:
            continue
        code, opening, end = node.code.as_string, [], 0
        while match := _DECLARATION.match(code, end):
            opening.append(match)
            end = match.end()
        declared = {m["name"] for m in opening}
        if len(opening) < 2 or any(
            declared & set(re.findall(r"\w+", m["value"])) or _EFFECT.search(m["value"]) for m in opening
        ):
            continue
        ordered = "".join(m[0] for m in sorted(opening, key=lambda m: m["name"])) + code[end:]
        if ordered != code:
            node.code = CodeBlock(ordered, dace.Language.CPP)
            changed += 1
    return changed
