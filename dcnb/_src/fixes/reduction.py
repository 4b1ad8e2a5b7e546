"""Reductions: the ONNX Reduce* ops over any constant axes (or all), either keepdims, their backward rules, and
ArgMax/ArgMin and CumSum.

The forward reductions are DaCe programs (Reduce library nodes, which dcnb's own Reduce expansions and row fusion
work on); their backward rules are maps where each input element's gradient is one expression, and C++ loops
where it needs a count per output element (ties of a maximum, zeros of a product).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import dace
import numpy as np
from dace import data as dt
from dace.autodiff.base_abc import BackwardImplementation
from dace.autodiff.utils import add_empty_sdfg_for_node
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.libraries.standard import Reduce
from dace.registry import autoregister_params
from dace.sdfg.utils import in_desc_with_name, out_desc_with_name
from dace.transformation.onnx import constant_folding
from dace.transformation.onnx.replacement import onnx_constant_or_none
from dace.transformation.transformation import ExpandTransformation

from . import reduce_node

from .cpp import at, cpp_backward, cpp_expansion, forward_in, forward_out, loops, offset
from .elementwise import ZeroBackward
from .programs import parsed
from .registry import CHOOSE, choice, default_backward, on_cpu, pure_expansion


def _constant_input(node, state, sdfg, connector: str) -> list[int] | None:
    """The value of a constant integer input of ``node`` as a list; [] where it is not connected, None where it is
    not a constant."""
    edge = next((e for e in state.in_edges(node) if e.dst_conn == connector), None)
    if edge is None:
        return []
    try:
        value = onnx_constant_or_none(sdfg, edge.src.data)
    except AttributeError:  # an SDFG not imported from ONNX (DaCe's backward rules nest some) has no constants
        return None
    if value is None:
        return None
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def reduced_axes(node, state, sdfg) -> tuple[int, ...] | None:
    """The axes a Reduce* node reduces, non-negative and sorted (every axis where none are given, none for a no-op
    with noop_with_empty_axes); None where they are not constant."""
    rank = len(in_desc_with_name(node, state, sdfg, "data").shape)
    # before opset 18 (13 for ReduceSum) an attribute; DaCe's own backward rules set it too, beside an axes input
    # that a tasklet fills
    attribute = getattr(node, "axes", None)
    attribute = [attribute] if isinstance(attribute, int) else list(attribute or [])
    axes = _constant_input(node, state, sdfg, "axes")
    if axes is None and not attribute:
        return None
    axes = axes or attribute
    if not axes:
        return () if getattr(node, "noop_with_empty_axes", 0) else tuple(range(rank))
    return tuple(sorted({a % rank for a in axes})) if rank else ()


def _count(shape, axes: tuple[int, ...]) -> int:
    return math.prod(int(shape[a]) for a in axes)


def _projected(index: list[str], axes: tuple[int, ...], keepdims: bool) -> list[str]:
    """The index of the output element that the input element at ``index`` reduces into."""
    if keepdims:
        return ["0" if k in axes else i for k, i in enumerate(index)]
    return [i for k, i in enumerate(index) if k not in axes]


# The forward of each op over (axes, keepdims, scalar type, count of elements reduced into each output): a program
# for programs.parsed. Constants are of the data's type: a Python float would make the arithmetic double.
def _sum(axes, keep, t, count):
    def prog(data, reduced):
        reduced[:] = np.add.reduce(data, axis=axes, keepdims=keep)

    return prog


def _mean(axes, keep, t, count):
    inv_count = t(1 / count)

    def prog(data, reduced):
        reduced[:] = np.add.reduce(data, axis=axes, keepdims=keep) * inv_count

    return prog


# gap: DaCe's Reduce keeps a NaN only where it comes last (its C++ max(a, b) is b unless a > b), and dcnb's row
# reduction (fixes/reduce_node.py) never: amax and max(dim) of a NaN gave a number, PyTorch's give NaN. The sum of
# the NaNs alone (0 where there are none) is added in: a pass of its own, the maxima's loop staying a vector one.
def _max(axes, keep, t, count):
    zero = t(0)

    def prog(data, reduced):
        nans = np.add.reduce(dace.elementwise(lambda v: v if v != v else zero, data), axis=axes, keepdims=keep)
        reduced[:] = np.maximum.reduce(data, axis=axes, keepdims=keep) + nans

    return prog


def _min(axes, keep, t, count):
    zero = t(0)

    def prog(data, reduced):
        nans = np.add.reduce(dace.elementwise(lambda v: v if v != v else zero, data), axis=axes, keepdims=keep)
        reduced[:] = np.minimum.reduce(data, axis=axes, keepdims=keep) + nans

    return prog


def _prod(axes, keep, t, count):
    def prog(data, reduced):
        reduced[:] = np.multiply.reduce(data, axis=axes, keepdims=keep)

    return prog


def _l1(axes, keep, t, count):
    def prog(data, reduced):
        reduced[:] = np.add.reduce(np.abs(data), axis=axes, keepdims=keep)

    return prog


def _l2(axes, keep, t, count):
    def prog(data, reduced):
        reduced[:] = np.sqrt(np.add.reduce(data * data, axis=axes, keepdims=keep))

    return prog


def _log_sum_exp(axes, keep, t, count):
    zero = t(0)

    # stable: the maximum out of every exponential, so that none overflows; an infinite maximum is not taken out (as
    # PyTorch's logsumexp: inf - inf would be NaN)
    def prog(data, reduced):
        top = dace.elementwise(lambda v: zero if isinf(v) else v, np.maximum.reduce(data, axis=axes, keepdims=True))
        total = np.add.reduce(np.exp(data - top), axis=axes, keepdims=True)
        reduced[:] = np.reshape(top + np.log(total), reduced.shape)

    return prog


FORWARD: dict[str, Callable] = {
    "ReduceSum": _sum,
    "ReduceMean": _mean,
    "ReduceMax": _max,
    "ReduceMin": _min,
    "ReduceProd": _prod,
    "ReduceL1": _l1,
    "ReduceL2": _l2,
    "ReduceLogSumExp": _log_sum_exp,
}


def _reduction_expansion(op: str) -> type[ONNXForward]:
    class Expansion(ONNXForward):
        @staticmethod
        def forward_can_be_applied(node, state, sdfg) -> bool:
            return reduced_axes(node, state, sdfg) is not None

        @staticmethod
        def forward(node, state, sdfg):
            axes = reduced_axes(node, state, sdfg)
            x = in_desc_with_name(node, state, sdfg, "data")
            if not axes:  # a no-op reduction (noop_with_empty_axes, or a scalar's)

                def prog(data, reduced):
                    reduced[:] = data

            else:
                prog = FORWARD[op](axes, bool(node.keepdims), x.dtype.type, _count(x.shape, axes))
            return parsed(prog, sdfg, state, node)

    Expansion.__name__ = f"{op}Expansion"
    return Expansion


# gap: DaCe's ReduceSum/Mean/Max/Min need the axes given (x.sum(), a loss's mean over everything was refused), and
# it has no ReduceProd, ReduceL1, ReduceL2 (F.normalize, vector_norm) and ReduceLogSumExp (torch.logsumexp)
for _op in FORWARD:
    pure_expansion(_op, name="dcnb" if _op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin") else "pure")(
        _reduction_expansion(_op)
    )


def _map_backward(forward_node, context, expression: str, reads: tuple[str, ...] = ()):
    """The backward of a reduction whose input gradient is, element by element, ``expression`` (Python) of the
    output gradient ``__dy``, and as ``reads`` names them, the input element ``__x`` and its output ``__y``."""
    fwd_sdfg, fwd_state = context.forward_sdfg, context.forward_state
    axes = reduced_axes(forward_node, fwd_state, fwd_sdfg)
    x = forward_in(forward_node, context, "data")
    node, result = add_empty_sdfg_for_node(forward_node, [*reads, "reduced_grad", "data_grad"], context)
    shape = list(x.shape) or [1]
    params = [f"__i{k}" for k in range(len(shape))]
    element = ", ".join(params) if x.shape else "0"
    out = ", ".join(_projected(params, axes, bool(forward_node.keepdims))) or "0"
    memlets = {"__dy": dace.Memlet(f"reduced_grad[{out}]")}
    if "data" in reads:
        memlets["__x"] = dace.Memlet(f"data[{element}]")
    if "reduced" in reads:
        memlets["__y"] = dace.Memlet(f"reduced[{out}]")
    node.sdfg.add_state().add_mapped_tasklet(
        f"{forward_node.label}_backward_map",
        {p: f"0:{s}" for p, s in zip(params, shape)},
        memlets,
        f"__dx = {expression}",
        {"__dx": dace.Memlet(f"data_grad[{element}]")},
        external_edges=True,
    )
    return node, result


def _per_output(
    x: dt.Data,
    y: dt.Data,
    axes: tuple[int, ...],
    keepdims: bool,
    prologue: str,
    passes: list[str],
    epilogue: str = "",
    backwards: tuple[int, ...] = (),
) -> str:
    """C++ visiting every output element: ``prologue``, then each of ``passes`` once for every input element that
    reduces into it (from the last to the first for the passes numbered in ``backwards``), then ``epilogue``. All
    see ``yi``, the output's offset, and the index ``i<axis>``; the passes see ``xi``, the input element's offset,
    too. (Plain locals per output: no scratch arrays, which CUDA's device code could not allocate.)"""
    index = [f"i{k}" for k in range(len(x.shape))]
    kept = [k for k in range(len(x.shape)) if k not in axes]
    outer, outer_tail = loops([index[k] for k in kept], [x.shape[k] for k in kept])
    inner, inner_tail = loops([index[a] for a in axes], [x.shape[a] for a in axes])
    down = "".join(f"for (long long {index[a]} = {x.shape[a]} - 1; {index[a]} >= 0; --{index[a]}) {{\n" for a in axes)
    each = "".join(
        (down if k in backwards else inner) + f"const long long xi = {offset(x, index)};\n" + body + inner_tail
        for k, body in enumerate(passes)
    )
    output = f"const long long yi = {offset(y, _projected(index, axes, keepdims))};\n"
    return outer + output + prologue + each + epilogue + outer_tail


def _extremum_backward(forward_node, context):
    """Max/Min: the output gradient goes to the input elements equal to the output (to its NaNs, where it is NaN),
    split evenly among them, the others' being 0: as PyTorch's x.max() and amax (whose others are 0 times the
    gradient: NaN where that is not finite); its max(dim) picks one of them, the same where there is one."""
    axes = reduced_axes(forward_node, context.forward_state, context.forward_sdfg)
    x, y = forward_in(forward_node, context, "data"), forward_out(forward_node, context, "reduced")
    hit = "(x == y || (x != x && y != y))"
    body = _per_output(
        x,
        y,
        axes,
        bool(forward_node.keepdims),
        "long long ties = 0;\nconst auto y = reduced[yi];\n",
        [
            f"const auto x = data[xi];\nif {hit} ++ties;\n",
            # loaded before choosing with them (fixes/cpp.py: GCC's masked loads)
            f"const auto x = data[xi];\nconst auto dy = reduced_grad[yi];\ndata_grad[xi] = {hit} ? dy / ties : 0;\n",
        ],
    )
    return cpp_backward(forward_node, context, ["data", "reduced", "reduced_grad", "data_grad"], body)


def _prod_backward(forward_node, context):
    """ReduceProd, as PyTorch's: dy * (prod / x) where the input holds no zero, else dy times the product of the
    elements before x in its slice and that of those after it (a division would be 0 / 0 at a zero, and NaN at an
    infinity or NaN that the others' product holds without it)."""
    axes = reduced_axes(forward_node, context.forward_state, context.forward_sdfg)
    x, y = forward_in(forward_node, context, "data"), forward_out(forward_node, context, "reduced")
    every = [f"j{k}" for k in range(len(x.shape))]
    head, tail = loops(every, x.shape)
    body = "long long zeros = 0;\n" + head + f"zeros += {at('data', x, every)} == 0;\n" + tail
    body += _per_output(
        x,
        y,
        axes,
        bool(forward_node.keepdims),
        # the products in the data's type, as PyTorch's: in double, a product could come back from beyond float's
        f"const auto dy = reduced_grad[yi];\nconst auto y = reduced[yi];\n{x.dtype.ctype} before = 1, after = 1;\n",
        [
            "const auto x = data[xi];\ndata_grad[xi] = zeros ? before : dy * (y / x);\nbefore *= x;\n",
            "if (zeros) {\nconst auto x = data[xi];\ndata_grad[xi] = dy * (data_grad[xi] * after);\nafter *= x;\n}\n",
        ],
        backwards=(1,),
    )
    return cpp_backward(forward_node, context, ["data", "reduced", "reduced_grad", "data_grad"], body)


def _typed(forward_node, context) -> str:
    return f"dace.{forward_in(forward_node, context, 'data').dtype.to_string()}"


# the input gradient of each reduction: (forward_node, context) -> (backward node, result)
BACKWARD: dict[str, Callable] = {
    "ReduceSum": lambda n, c: _map_backward(n, c, "__dy"),
    "ReduceMax": _extremum_backward,
    "ReduceMin": _extremum_backward,
    "ReduceProd": _prod_backward,
    "ReduceL1": lambda n, c: _map_backward(
        n, c, f"__dy * ({_typed(n, c)}(__x > 0) - {_typed(n, c)}(__x < 0))", ("data",)
    ),
    # 0 where the norm is 0, as PyTorch's (the subgradient it picks); divided first, as PyTorch's: a norm overflowed
    # to inf gives 0, not inf / inf
    "ReduceL2": lambda n, c: _map_backward(
        n, c, f"__x * (__dy / __y) if __y != 0 else {_typed(n, c)}(0)", ("data", "reduced")
    ),
    "ReduceLogSumExp": lambda n, c: _map_backward(n, c, "__dy * exp(__x - __y)", ("data", "reduced")),
}


def _reduction_backward(op: str) -> type[BackwardImplementation]:
    class Backward(BackwardImplementation):
        @staticmethod
        def backward_can_be_applied(node, state, sdfg) -> bool:
            return reduced_axes(node, state, sdfg) is not None

        @staticmethod
        def backward(forward_node, context, given_gradients, required_gradients):
            return BACKWARD[op](forward_node, context)

    Backward.__name__ = f"{op}Backward"
    return Backward


# gap: DaCe's autodiff crashed on the maximum and minimum of its Reduce nodes (x.max(dim), amax), guesses
# ReduceSum's axes from the shapes (wrong where sizes repeat), and has no rule for the reductions it lacks.
# ReduceMean has none of ours: autodiff differentiates its expansion (a sum and a scaling) as before.
for _op in BACKWARD:
    autoregister_params(op=_op, name="dcnb")(_reduction_backward(_op))
    default_backward(_op)


def _arg_applies(node, state, sdfg) -> bool:
    return len(in_desc_with_name(node, state, sdfg, "data").shape) > 0


def _arg_expansion(op: str, better: str) -> type[ONNXForward]:
    """ArgMax/ArgMin: the index along ``axis`` of the first (select_last_index: the last) extremum, where ``better``
    (C++ of ``v`` and ``best``) says an element beats the best so far; the first NaN wins, as in PyTorch."""

    class Expansion(ONNXForward):
        @staticmethod
        def forward_can_be_applied(node, state, sdfg) -> bool:
            return _arg_applies(node, state, sdfg)

        @staticmethod
        def forward(node, state, sdfg):
            x = in_desc_with_name(node, state, sdfg, "data")
            y = out_desc_with_name(node, state, sdfg, "reduced")
            axis = node.axis % len(x.shape)
            tie = " || v == best" if node.select_last_index else ""
            wins = f"best == best && (v != v || {better}{tie})"
            body = _per_output(
                x,
                y,
                (axis,),
                bool(node.keepdims),
                f"{x.dtype.ctype} best = 0;\nlong long found = 0;\n",
                [f"const auto v = data[xi];\nif (i{axis} == 0 || ({wins})) {{ best = v; found = i{axis}; }}\n"],
                "reduced[yi] = found;\n",
            )
            return cpp_expansion(node, state, sdfg, body)

    Expansion.__name__ = f"{op}Expansion"
    return Expansion


# gap: DaCe has no implementation of the ONNX ops ArgMax and ArgMin (x.argmax(dim)), nor a backward rule (their
# integer result has no gradient: ZeroBackward)
for _op, _better in (("ArgMax", "v > best"), ("ArgMin", "v < best")):
    pure_expansion(_op)(_arg_expansion(_op, _better))
    autoregister_params(op=_op, name="dcnb")(type(f"{_op}Backward", (ZeroBackward,), {}))
    default_backward(_op)


def _cumsum_axis(node, state, sdfg) -> int | None:
    axis = _constant_input(node, state, sdfg, "axis")
    rank = len(in_desc_with_name(node, state, sdfg, "x").shape)
    return axis[0] % rank if axis and rank else None


def _cumsum_loops(desc: dt.Data, axis: int, source: str, target: str, reverse: bool, exclusive: bool) -> str:
    """C++ for ``target`` = the cumulative sum of ``source`` along ``axis`` (arrays of ``desc``'s shape and
    strides), from the end where ``reverse``, each element's own term left out where ``exclusive``."""
    outer = [f"i{k}" for k in range(len(desc.shape)) if k != axis]
    head, tail = loops(outer, [s for k, s in enumerate(desc.shape) if k != axis])
    index = [f"i{k}" if k != axis else "j" for k in range(len(desc.shape))]
    size = desc.shape[axis]
    walk = f"for (long long j = {size} - 1; j >= 0; --j)" if reverse else f"for (long long j = 0; j < {size}; ++j)"
    step = (
        f"{at(target, desc, index)} = acc; acc += {at(source, desc, index)};\n"
        if exclusive
        else f"acc += {at(source, desc, index)}; {at(target, desc, index)} = acc;\n"
    )
    return head + "double acc = 0;\n" + walk + " {\n" + step + "}\n" + tail


@pure_expansion("CumSum", name="dcnb")
class CumSumExpansion(ONNXForward):
    # gap: DaCe's CumSum covers neither exclusive nor reverse, and its expansion (numpy's cumsum) is one DaCe's
    # autodiff fails on (x.cumsum(-1))
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return _cumsum_axis(node, state, sdfg) is not None

    @staticmethod
    def forward(node, state, sdfg):
        x = in_desc_with_name(node, state, sdfg, "x")
        axis = _cumsum_axis(node, state, sdfg)
        constant_folding.remove_node_and_computation(sdfg, state, node, "axis")
        body = _cumsum_loops(x, axis, "x", "y", bool(node.reverse), bool(node.exclusive))
        return cpp_expansion(node, state, sdfg, body)


@autoregister_params(op="CumSum", name="dcnb")
class CumSumBackward(BackwardImplementation):
    # gap: DaCe's autodiff has no rule for CumSum: its gradient is the cumulative sum of the output's gradient
    # taken the other way
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return _cumsum_axis(node, state, sdfg) is not None

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        x = forward_in(forward_node, context, "x")
        axis = _cumsum_axis(forward_node, context.forward_state, context.forward_sdfg)
        body = _cumsum_loops(
            x, axis, "y_grad", "x_grad", not forward_node.reverse, bool(forward_node.exclusive)
        )
        return cpp_backward(forward_node, context, ["y_grad", "x_grad"], body)


default_backward("CumSum")


# --- DaCe's Reduce library node ---------------------------------------------------------------------------------


def _reduce_implementation(node, state, sdfg) -> str:
    return reduce_node.implementation(node, state) if on_cpu(node, state, sdfg) else reduce_node.on_gpu(node, state)


@dace.library.expansion
class ExpandReduceDcnb(ExpandTransformation):
    # gap: DaCe's default Reduce expansion ("pure") adds every element into its output with an atomic operation,
    # which a CPU's threads contend for (a softmax's row sums and maxima: 26 ms where PyTorch takes 0.3); on the
    # CPU reductions now take dcnb's atomics-free expansions from the naive step on, as fuse_rows did
    environments = []
    expansion = choice(_reduce_implementation)


Reduce.register_implementation(CHOOSE, ExpandReduceDcnb)
Reduce.default_implementation = CHOOSE
