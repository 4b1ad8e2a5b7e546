"""C++ loops over described arrays: the bodies of dcnb's expansions and backward rules that DaCe's maps cannot
express (windows, gathers, per-sample loops).

Their strides are written into the code, so the nested SDFG holding such a body is never inlined (``kept_nested``):
inlined, simplify would hand the body a view with other strides where it removes a copy before it.

Bodies read an array element into a local before choosing with it (``const auto dy = g[i]; y[i] = c ? dy : 0;``),
never ``c ? g[i] : 0``: GCC 12.2 (Debian 12's) vectorizes the latter into masked loads that reuse one vector's mask
for the next, and so drops elements (ReLU6's gradient was 0 for some inputs in range).
"""

from __future__ import annotations

import copy

import dace
import dace.autodiff.utils as autodiff_utils
from dace import data as dt
from dace.autodiff.base_abc import BackwardContext, BackwardResult
from dace.libraries.onnx.nodes.onnx_op import ONNXOp
from dace.sdfg import nodes


def contiguous(desc: dt.Data) -> bool:
    """Whether ``desc`` is laid out row-major without gaps (a dimension of one element may have any stride: its
    one index is 0)."""
    if isinstance(desc, dt.Scalar):
        return True
    stride = 1
    for size, actual in zip(reversed(desc.shape), reversed(desc.strides)):
        if size != 1 and actual != stride:
            return False
        stride *= size
    return True


def channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a dense (N, C, spatial...) array with its channels innermost: element (n, c, s...) at
    row * C + c, its rows the (n, s...) in order (the ``channels_last`` action's layout; an (N, C) array's own)."""
    strides = [0] * len(shape)
    strides[1], step = 1, shape[1]
    for d in reversed([0, *range(2, len(shape))]):
        strides[d] = step
        step *= shape[d]
    return tuple(strides)


def channels_last(desc: dt.Data) -> bool:
    """Whether an (N, C, spatial...) array is laid out by ``channels_last_strides``."""
    if isinstance(desc, dt.Scalar) or len(desc.shape) < 2:
        return False
    return tuple(int(s) for s in desc.strides) == channels_last_strides(tuple(int(n) for n in desc.shape))


def offset(desc: dt.Data, index: list[str]) -> str:
    """C++ for the element offset of ``index`` in an array with ``desc``'s strides."""
    if isinstance(desc, dt.Scalar) or not index:
        return "0"
    return " + ".join(f"({i}) * {s}" for i, s in zip(index, desc.strides))


def at(name: str, desc: dt.Data, index: list[str]) -> str:
    """C++ for an element of an array that a tasklet reaches through the pointer ``name``."""
    return f"{name}[{offset(desc, index)}]"


def loops(variables: list[str], sizes: list) -> tuple[str, str]:
    head = "".join(f"for (long long {v} = 0; {v} < {s}; ++{v}) {{\n" for v, s in zip(variables, sizes))
    return head, "}\n" * len(variables)


def memory_order(desc: dt.Data) -> list[int] | None:
    """``desc``'s dimensions in memory order, the largest stride first (equal strides in dimension order); None
    where its strides are symbolic."""
    try:
        strides = [int(s) for s in desc.strides]
    except TypeError:
        return None
    return sorted(range(len(desc.shape)), key=lambda d: -strides[d])


def memory_loops(variables: list[str], desc: dt.Data) -> tuple[str, str]:
    """``loops`` over ``desc``'s elements (``variables`` index its dimensions in order), the dimension of the largest
    stride outermost: over a channels-last image the channels innermost, where shape order read an element C apart
    each step."""
    order = memory_order(desc)
    if order is None:  # symbolic strides: shape order
        return loops(variables, desc.shape)
    return loops([variables[d] for d in order], [desc.shape[d] for d in order])


def parallel_for(collapse: int = 1) -> str:
    """A pragma spreading the loop after it (``collapse`` loops nested in it) over the CPU's threads; nothing in
    code built for a GPU."""
    clause = f" collapse({collapse})" if collapse > 1 else ""
    return f"#if defined(_OPENMP) && !defined(__CUDA_ARCH__)\n#pragma omp parallel for{clause}\n#endif\n"


#: chunks of rows a sum over rows goes in (``row_chunks``)
ROW_CHUNKS = 32


def row_chunks(rows: int, size: int) -> tuple[str, str, int]:
    """C++ opening and closing a parallel loop over ``rows`` in at most ``ROW_CHUNKS`` chunks (``_r`` each row, in
    order within its chunk), each chunk adding into ``size`` partial sums of its own at ``_s`` (zeroed doubles of
    ``_part``), and the number of chunks. Added up per chunk, then over the chunks in order (``chunk_total``), the
    sums are the same on any number of threads. ``_part`` is the caller's to delete once totalled."""
    chunks = min(rows, ROW_CHUNKS)
    head = f"double* _part = new double[{chunks * size}]();\n" + parallel_for()
    head += f"for (long long _p = 0; _p < {chunks}; ++_p) {{\ndouble* _s = _part + _p * {size};\n"
    head += f"for (long long _r = _p * {rows} / {chunks}; _r < (_p + 1) * {rows} / {chunks}; ++_r) {{\n"
    return head, "}\n}\n", chunks


def chunk_total(name: str, chunks: int, size: int, at: str) -> str:
    """C++ declaring the double ``name``, the sum over ``row_chunks``'s chunks, in order, of partial sum ``at``."""
    return f"double {name} = 0;\nfor (long long _p = 0; _p < {chunks}; ++_p) {name} += _part[_p * {size} + {at}];\n"


def simd(sums: tuple[str, ...] = ()) -> str:
    """A pragma vectorizing the loop after it, adding into each of ``sums`` in vector lanes (the order of the
    additions changes, their precision does not); nothing in code built for a GPU."""
    clause = f" reduction(+: {', '.join(sums)})" if sums else ""
    return f"#if defined(_OPENMP) && !defined(__CUDA_ARCH__)\n#pragma omp simd{clause}\n#endif\n"


def cpp_tasklet(sdfg: dace.SDFG, label: str, inputs: list[str], outputs: list[str], body: str) -> dace.SDFGState:
    """Add a state to ``sdfg`` running ``body`` (C++) over its arrays, each reachable in ``body`` as a pointer
    of its own name; returns it."""
    state = sdfg.add_state()
    # the names are declared in a block of their own: they shadow the SDFG's arguments, which DaCe assigns
    # scalar outputs to after the tasklet
    results, prologue, epilogue = [], ["{"], []
    for n in inputs + outputs:
        desc = sdfg.arrays[n]
        ctype = desc.dtype.ctype
        if _one_element(desc):
            prologue.append(f"{ctype} {n}[1] = {{{'_c_' + n if n in inputs else '0'}}};")
            if n in outputs:
                results.append(f"{ctype} _r_{n};")
                epilogue.append(f"_r_{n} = {n}[0];")
        else:
            qualifier = "const " if n in inputs else ""
            prologue.append(f"{qualifier}{ctype}* {n} = _c_{n};")
    epilogue.append("}")
    epilogue.extend(f"_c_{n} = _r_{n};" for n in outputs if _one_element(sdfg.arrays[n]))
    tasklet = state.add_tasklet(
        label,
        {f"_c_{n}": _connector_type(sdfg.arrays[n]) for n in inputs},
        {f"_c_{n}": _connector_type(sdfg.arrays[n]) for n in outputs},
        "\n".join([*results, *prologue, body, *epilogue]),
        language=dace.Language.CPP,
    )
    for n in inputs:
        state.add_edge(state.add_read(n), None, tasklet, f"_c_{n}", dace.Memlet.from_array(n, sdfg.arrays[n]))
    for n in outputs:
        state.add_edge(tasklet, f"_c_{n}", state.add_write(n), None, dace.Memlet.from_array(n, sdfg.arrays[n]))
    return state


def kept_nested(nested: nodes.Node) -> None:
    """Keep ``nested``, a node an op expanded to, from being inlined where it is a nested SDFG running C++ of dcnb's:
    DaCe then removes no copy that would give it an array of other strides.

    gap: DaCe takes a pointer connector for an array accessed through its descriptor's strides; after auto_optimize
    expanded every op and simplified, a C++ body that read a slice's copy with the copy's strides read the sliced
    array itself (F.pad(x[:, 1:]), x[:, :-1].cumsum(-1): wrong values)
    """
    if isinstance(nested, nodes.NestedSDFG) and any(
        isinstance(n, nodes.Tasklet) and n.code.language == dace.Language.CPP
        for n, _ in nested.sdfg.all_nodes_recursive()
    ):
        nested.no_inline = True


def expansion_sdfg(node: nodes.LibraryNode, state, sdfg) -> tuple[dace.SDFG, list[str], list[str]]:
    """An empty SDFG for the expansion of ``node`` (an ONNX op or a library node of dcnb's), with its connectors'
    arrays named as the connectors, and the names of its inputs and outputs."""
    nsdfg = dace.SDFG(f"{node.label}_expansion")
    inputs, outputs = [], []
    edges = (
        node.iter_edges(state)
        if isinstance(node, ONNXOp)
        else [*((e, True) for e in state.in_edges(node)), *((e, False) for e in state.out_edges(node))]
    )
    for edge, is_input in edges:
        name = edge.dst_conn if is_input else edge.src_conn
        desc = copy.deepcopy(sdfg.arrays[edge.data.data])
        if isinstance(desc, dt.View):  # (a library node expanded at code generation may sit on a view)
            desc = desc.as_array()
        desc.transient = False
        nsdfg.add_datadesc(name, desc)
        (inputs if is_input else outputs).append(name)
    return nsdfg, inputs, outputs


def cpp_expansion(node: nodes.LibraryNode, state, sdfg, body: str) -> dace.SDFG:
    """The expansion of ``node`` into ``body`` (C++) over its connectors' arrays, named as the connectors."""
    nsdfg, inputs, outputs = expansion_sdfg(node, state, sdfg)
    cpp_tasklet(nsdfg, f"{node.label}_tasklet", inputs, outputs, body)
    return nsdfg


def cpp_backward(
    forward_node: ONNXOp, context: BackwardContext, names: list[str], body: str
) -> tuple[nodes.NestedSDFG, BackwardResult]:
    """A backward node running ``body`` (C++) over the arrays in ``names`` (forward connectors, and with a
    ``_grad`` suffix their gradients), each reachable in ``body`` as a pointer of that name.

    Every gradient it produces must be written completely (zeroed first where it is accumulated).
    """
    node, result = autodiff_utils.add_empty_sdfg_for_node(forward_node, names, context)
    inputs = [n for n in names if n in node.in_connectors]
    outputs = [n for n in names if n in node.out_connectors]
    cpp_tasklet(node.sdfg, f"{forward_node.label}_backward", inputs, outputs, body)
    kept_nested(node)
    return node, result


def _one_element(desc: dt.Data) -> bool:
    """Whether a body reaches ``desc`` through a value, copied in and out, rather than a pointer.

    gap: DaCe's dead dataflow elimination replaces a one-element output nothing reads by a local of the element's
    type, which a body taking a pointer cannot take (BART's and Marian's auto_optimize: an unread gradient of a
    masked fill's one-element value, "cannot convert 'float' to 'float*'")
    """
    return isinstance(desc, dt.Scalar) or all(int(s) == 1 for s in desc.shape)


def _connector_type(desc: dt.Data):
    return desc.dtype if _one_element(desc) else dace.pointer(desc.dtype)


def zero(name: str, desc: dt.Data) -> str:
    if isinstance(desc, dt.Scalar):
        return f"{name}[0] = 0;\n"
    variables = [f"__z{i}" for i in range(len(desc.shape))]
    head, tail = memory_loops(variables, desc)
    return head + f"{at(name, desc, variables)} = 0;\n" + tail


def forward_in(forward_node, context, name):
    return autodiff_utils.forward_in_desc_with_name(forward_node, context, name)


def forward_out(forward_node, context, name):
    return autodiff_utils.forward_out_desc_with_name(forward_node, context, name)
