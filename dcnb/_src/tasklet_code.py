"""Reading and rewriting the Python code of tasklets: one place that knows how DaCe writes typed constants."""

from __future__ import annotations

import ast

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
