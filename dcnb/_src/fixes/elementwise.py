"""Elementwise ops: activations, math, comparisons and logic DaCe has no expansion for (or expands wrong), and
Where's backward under broadcasting."""

from __future__ import annotations

import copy
import functools
import math
import re
from collections.abc import Callable

import dace
from dace.autodiff.base_abc import BackwardContext, BackwardImplementation, BackwardResult
from dace.autodiff.utils import add_empty_sdfg_for_node
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.libraries.onnx.nodes.onnx_op import ONNXOp
from dace.libraries.onnx.op_implementations.normalization_ops import PureDropout
from dace.registry import autoregister_params
from dace.sdfg.utils import out_desc_with_name
from dace.transformation.onnx import constant_folding
from dace.transformation.onnx.replacement import onnx_constant_or_none

from ..errors import UnsupportedOpError
from ..export_rules import HARDTANH, STOP_GRADIENT
from ..names import readable
from .array_ops import broadcast_index
from .cpp import at, cpp_backward, forward_in, forward_out, loops, zero
from .registry import default_backward, pure_expansion


def _inputs_in_order(node, state) -> list:
    """``node``'s input edges in ONNX order, variadic ones last by their number.

    gap: DaCe's ``iter_inputs_in_onnx_order`` takes the op's first n inputs for n edges, so an optional input left
    out before a given one (Clip's min in torch.clamp(x, max=0.5): Swin V2's logit scale) failed the expansion.
    """
    by_connector = {e.dst_conn: e for e in state.in_edges(node)}
    named = [p.name for p in node.schema.inputs]
    variadic = sorted((c for c in by_connector if c not in named), key=lambda c: int(c.rpartition("__")[2]))
    return [by_connector[c] for c in (*(n for n in named if n in by_connector), *variadic)]


def _mapped(node, state, sdfg, expression, constants: tuple[str, ...] = ()) -> dace.SDFG:
    """The op as one map over its output, whose element is ``expression(t, operands)``: Python over the elements of
    the inputs (numpy-style broadcast), ``operands`` by connector in ONNX order, constants typed by ``t`` (e.g.
    "dace.float32"). Inputs named in ``constants`` that hold a constant scalar enter as that number, and their
    input is removed: a backward rule of the op must not read it (Clip's folds the same constants). Autodiff
    differentiates the expression (a Python tasklet) where the op has no backward rule."""
    y_name = next(iter(node.out_connectors))
    y = copy.deepcopy(out_desc_with_name(node, state, sdfg, y_name))
    edges = _inputs_in_order(node, state)
    t = f"dace.{sdfg.arrays[edges[0].data.data].dtype.to_string()}"
    nsdfg = dace.SDFG(f"{node.label}_expansion")
    shape = list(y.shape) or [1]
    params = [f"__i{i}" for i in range(len(shape))]
    operands, memlets = {}, {}
    for k, edge in enumerate(edges):
        value = onnx_constant_or_none(sdfg, edge.src.data) if edge.dst_conn in constants else None
        if isinstance(value, (int, float)):
            constant_folding.remove_node_and_computation(sdfg, state, node, edge.dst_conn)
            operands[edge.dst_conn] = f"{t}({value!r})"
            continue
        desc = copy.deepcopy(sdfg.arrays[edge.data.data])
        desc.transient = False
        nsdfg.add_datadesc(edge.dst_conn, desc)
        read = ", ".join(broadcast_index(desc, shape, params)) or "0"
        memlets[f"__x{k}"] = dace.Memlet(f"{edge.dst_conn}[{read}]")
        operands[edge.dst_conn] = f"__x{k}"
    y.transient = False
    nsdfg.add_datadesc(y_name, y)
    nsdfg.add_state().add_mapped_tasklet(
        f"{node.label}_map",
        {p: f"0:{s}" for p, s in zip(params, shape)},
        memlets,
        f"__y = {expression(t, operands)}",
        {"__y": dace.Memlet(f"{y_name}[{', '.join(params) if y.shape else '0'}]")},
        external_edges=True,
    )
    return nsdfg


def _register(op: str, expression, name: str = "pure", constants: tuple[str, ...] = ()) -> None:
    """Register ``expression(t, operands, node)`` (see ``_mapped``) as the expansion of the ONNX op ``op``."""

    class Expansion(ONNXForward):
        @staticmethod
        def forward(node, state, sdfg):
            return _mapped(node, state, sdfg, lambda t, operands: expression(t, operands, node), constants)

    Expansion.__name__ = f"{op}Expansion"
    pure_expansion(op, name)(Expansion)


def _unary(op: str, expression, name: str = "pure") -> None:
    """Register ``expression(t, x, node)`` for an op of one input."""
    _register(op, lambda t, operands, node: expression(t, *operands.values(), node), name)


def _nary(op: str, expression) -> None:
    """Register ``expression(t, *inputs)`` for an op of any number of inputs."""
    _register(op, lambda t, operands, node: expression(t, *operands.values()))


#: an op's gradients: (t, operands, node) -> Python of each input's gradient, by connector (see _mapped_backward)
Gradients = Callable[[str, dict[str, str], ONNXOp], dict[str, str]]


def _mapped_backward(
    forward_node: ONNXOp, context: BackwardContext, required: list[str], gradients: Gradients
) -> tuple[dace.nodes.NestedSDFG, BackwardResult]:
    """The backward of an elementwise op as one map over its output, as autodiff makes of a map: the gradient of
    each input in ``required`` is ``gradients(t, operands, node)[connector]``, Python of the inputs' elements
    (``operands``, named as ``_mapped`` names them), the output's element ``__y`` and its gradient ``__dy``. A
    broadcast input's gradient is the sum over what it was broadcast to."""
    y_name = next(iter(forward_node.out_connectors))
    y = forward_out(forward_node, context, y_name)
    edges = _inputs_in_order(forward_node, context.forward_state)
    t = f"dace.{forward_in(forward_node, context, edges[0].dst_conn).dtype.to_string()}"
    operands = {e.dst_conn: f"__x{k}" for k, e in enumerate(edges)}
    wanted = {c: g for c, g in gradients(t, operands, forward_node).items() if c in required}
    code = "\n".join(f"__d{k} = {g}" for k, g in enumerate(wanted.values()))
    used = set(re.findall(r"\w+", code))
    reads = [c for c, v in operands.items() if v in used] + ([y_name] if "__y" in used else [])
    grads = [f"{c}_grad" for c in wanted]
    node, result = add_empty_sdfg_for_node(forward_node, [*reads, f"{y_name}_grad", *grads], context)
    nsdfg = node.sdfg
    shape = list(y.shape) or [1]
    params = [f"__i{i}" for i in range(len(shape))]

    def element(name: str) -> str:
        return f"{name}[{', '.join(broadcast_index(nsdfg.arrays[name], shape, params)) or '0'}]"

    inputs = {operands.get(c, "__y"): dace.Memlet(element(c)) for c in reads}
    inputs["__dy"] = dace.Memlet(element(f"{y_name}_grad"))
    outputs, summed = {}, []
    for k, g in enumerate(grads):
        broadcast = math.prod(nsdfg.arrays[g].shape) != math.prod(shape)
        outputs[f"__d{k}"] = dace.Memlet(element(g), wcr="lambda a, b: a + b" if broadcast else None)
        summed += [g] * broadcast
    body = nsdfg.add_state()
    if summed:  # the sums start from zero
        zeroed = nsdfg.add_state_before(body)
        for g in summed:
            zero_params = [f"__z{i}" for i in range(len(nsdfg.arrays[g].shape))]
            zeroed.add_mapped_tasklet(
                f"{g}_zero",
                {p: f"0:{s}" for p, s in zip(zero_params, nsdfg.arrays[g].shape)},
                {},
                "__o = 0",
                {"__o": dace.Memlet(f"{g}[{', '.join(zero_params)}]")},
                external_edges=True,
            )
    body.add_mapped_tasklet(
        f"{forward_node.label}_backward_map",
        {p: f"0:{s}" for p, s in zip(params, shape)},
        inputs,
        code,
        outputs,
        external_edges=True,
    )
    return node, result


def _backward(op: str, gradients: Gradients, applies: Callable[..., bool] = lambda node, state, sdfg: True) -> None:
    """Register ``gradients(t, operands, node)`` (see ``_mapped_backward``) as the backward of ``op``, where
    ``applies``."""

    class Backward(BackwardImplementation):
        @staticmethod
        def backward_can_be_applied(node, state, sdfg) -> bool:
            return applies(node, state, sdfg)

        @staticmethod
        def backward(forward_node, context, given_gradients, required_gradients):
            return _mapped_backward(forward_node, context, required_gradients, gradients)

    Backward.__name__ = f"{op}Backward"
    autoregister_params(op=op, name="dcnb")(Backward)
    default_backward(op)


def _elu(t: str, x: str, alpha: float, scale: float = 1.0, by: float = 1.0) -> str:
    """scale * x for x > 0, else scale * alpha * (exp(x / by) - 1): ELU, SELU (scaled), CELU (by alpha)."""
    return f"({x} * {t}({scale!r}) if {x} > {t}(0) else {t}({alpha * scale!r}) * expm1({x} / {t}({by!r})))"


def _elu_gradient(t: str, x: str, alpha: float, scale: float = 1.0, by: float = 1.0) -> str:
    return f"(__dy * {t}({scale!r}) if {x} > {t}(0) else __dy * {t}({alpha * scale / by!r}) * exp({x} / {t}({by!r})))"


def _extremum(xs: tuple[str, ...], beyond: str) -> str:
    """The largest (``beyond`` ">") or smallest ("<") of ``xs``, NaN where one is NaN (torch.maximum, minimum)."""
    return functools.reduce(lambda a, b: f"({a} if {a} {beyond} {b} or {a} != {a} else {b})", xs)


def _extremum_gradients(t: str, operands: dict[str, str], beyond: str) -> dict[str, str]:
    """torch.maximum's (``beyond`` ">") and minimum's gradients: all of it to the one beyond the other, half to
    each where they are equal, all to both where one is NaN."""
    if len(operands) == 1:
        return {c: "__dy" for c in operands}
    (ca, a), (cb, b) = operands.items()
    half = f"__dy / {t}(2)"
    return {
        ca: f"({half} if {a} == {b} else ({t}(0) if {b} {beyond} {a} else __dy))",
        cb: f"({half} if {a} == {b} else ({t}(0) if {a} {beyond} {b} else __dy))",
    }


def _mod(t: str, a: str, b: str, fmod: int) -> str:
    if fmod:
        return f"fmod({a}, {b})"
    if t.startswith("dace.float"):
        return f"{a} - {b} * floor({a} / {b})"
    return f"(({a} % {b}) + {b}) % {b}"  # C++'s % truncates toward zero; Python's and PyTorch's floor


def _is_inf(x: str, negative: int, positive: int) -> str:
    """Whether ``x`` is infinite with a sign IsInf detects."""
    if negative and positive:
        return f"isinf({x})"
    if negative or positive:
        return f"isinf({x}) and {x} {'<' if negative else '>'} 0"
    return "False"


def _clip(t: str, operands: dict[str, str]) -> str:
    # conditionals, not min and max: the nested SDFG's arrays are named as Clip's connectors, min and max, which
    # hide the functions in the generated C++; a NaN passes through, as in PyTorch
    x = operands["input"]
    if "max" in operands:
        x = f"({operands['max']} if {x} > {operands['max']} else {x})"
    if "min" in operands:
        x = f"({operands['min']} if {operands['input']} < {operands['min']} else {x})"
    return x


def _power(t: str, x: str, y: str) -> str:
    """``x ** y`` as PyTorch's CPU kernel raises a tensor to a constant (``y`` as ``_mapped`` writes one): products
    for 2 and 3, square roots for 0.5 and -0.5, quotients for -1 and -2, else ``pow``. Its rounding is then
    PyTorch's, and autodiff's derivative of a product is a product: the backward's ``pow(x, 2.0)`` in GPT-2's GELU
    took its map 2.17 ms per call of a 230 ms block (8x128x768), the product 1.08."""
    found = re.fullmatch(r"dace\.\w+\((.+)\)", y)
    value = float(found.group(1)) if found else None
    products = {2.0: f"({x} * {x})", 3.0: f"({x} * {x} * {x})"}
    if t.startswith("dace.float"):
        products |= {
            0.5: f"sqrt({x})", -0.5: f"({t}(1) / sqrt({x}))", -1.0: f"({t}(1) / {x})", -2.0: f"({t}(1) / ({x} * {x}))",
        }
    return products.get(value, f"{x} ** {y}")


# gap: DaCe has no implementation of these ONNX ops (nn.Hardsigmoid, Hardswish as in MobileNetV3, Softsign's |x|,
# torch.atan and kin)
_unary("HardSigmoid", lambda t, x, n: f"max({t}(0), min({t}(1), {t}({n.alpha!r}) * {x} + {t}({n.beta!r})))")
_unary("HardSwish", lambda t, x, n: f"{x} * min(max({x} + {t}(3), {t}(0)), {t}(6)) / {t}(6)")
_unary("Abs", lambda t, x, n: f"max({x}, -{x})")  # max's derivative is sign(x), 0 at 0 as PyTorch's
for _name in ("Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"):
    _unary(_name, lambda t, x, n, f=_name.lower(): f"{f}({x})")
# gap: DaCe has no implementation of these piecewise constant ONNX ops (their derivative, 0: ZeroBackward)
_unary("Sign", lambda t, x, n: f"{t}({x} > 0) - {t}({x} < 0)")
_unary("Floor", lambda t, x, n: f"floor({x})")
_unary("Ceil", lambda t, x, n: f"ceil({x})")
_unary("Round", lambda t, x, n: f"nearbyint({x})")  # halves to even, as ONNX and torch.round (round() goes up)
# gap: DaCe has no implementation of ONNX comparisons and logic (masks: x > 0, ~mask, a & b)
COMPARISONS = {"Greater": ">", "Less": "<", "GreaterOrEqual": ">=", "LessOrEqual": "<=", "Equal": "=="}
for _name, _op in COMPARISONS.items():
    _nary(_name, lambda t, a, b, o=_op: f"{a} {o} {b}")
_nary("And", lambda t, a, b: f"{a} and {b}")
_nary("Or", lambda t, a, b: f"{a} or {b}")
_nary("Xor", lambda t, a, b: f"{a} != {b}")
_unary("Not", lambda t, x, n: f"not {x}")
# gap: DaCe has no implementation of the ONNX ops IsNaN and IsInf (scaled_dot_product_attention with a boolean mask)
_unary("IsNaN", lambda t, x, n: f"isnan({x})")
_unary("IsInf", lambda t, x, n: _is_inf(x, n.detect_negative, n.detect_positive))
# gap: DaCe has no implementation of the ONNX op Mod (%, torch.remainder and fmod); fmod=0 rounds the quotient down
_register("Mod", lambda t, o, n: _mod(t, o["A"], o["B"], n.fmod), name="pure")
# gap: DaCe's Pow truncates a constant exponent to an integer (x ** 0.5 computed x ** 0)
_register("Pow", lambda t, o, n: _power(t, o["X"], o["Y"]), name="dcnb", constants=("Y",))
# gap: DaCe's Clip needs both bounds (clamp_min crashed with StopIteration), and constant ones
_register("Clip", lambda t, o, n: _clip(t, o), name="dcnb", constants=("min", "max"))

# Ops that choose between cases test as PyTorch's kernels do, so that a NaN falls in the case that keeps it: not
# max(x, 0), which DaCe's C++ makes 0 for NaN. Their backward rules are PyTorch's gradients (the derivative sympy
# takes of such a test is a step, 0 for NaN, where PyTorch's ReLU passes the gradient on).
# gap: DaCe's Relu and LeakyRelu are max(x, 0) (+ alpha * min(x, 0)): 0 for NaN, where PyTorch's give NaN
_unary("Relu", lambda t, x, n: f"({t}(0) if {x} < {t}(0) else {x})", name="dcnb")
_backward("Relu", lambda t, o, n: {"X": f"({t}(0) if {o['X']} <= {t}(0) else __dy)"})
_unary("LeakyRelu", lambda t, x, n: f"({x} if {x} > {t}(0) else {x} * {t}({n.alpha!r}))", name="dcnb")
_backward("LeakyRelu", lambda t, o, n: {"X": f"(__dy if {o['X']} > {t}(0) else __dy * {t}({n.alpha!r}))"})
# gap: DaCe has no implementation of the ONNX ops Max, Min (torch.maximum, minimum; variadic), PRelu, ELU, SELU, CELU
for _name, _beyond in (("Max", ">"), ("Min", "<")):
    _nary(_name, lambda t, *xs, beyond=_beyond: _extremum(xs, beyond))
    _backward(
        _name,
        lambda t, o, n, beyond=_beyond: _extremum_gradients(t, o, beyond),
        applies=lambda node, state, sdfg: state.in_degree(node) <= 2,
    )
_nary("PRelu", lambda t, x, slope: f"({x} if {x} > {t}(0) else {slope} * {x})")
_backward(
    "PRelu",
    lambda t, o, n: {
        "X": f"(__dy if {o['X']} > {t}(0) else {o['slope']} * __dy)",
        "slope": f"({t}(0) if {o['X']} > {t}(0) else {o['X']} * __dy)",
    },
)
#: (alpha, scale, by) of _elu for each op of the ELU family
_ELUS = {
    "Elu": lambda n: (n.alpha,),
    "Selu": lambda n: (n.alpha, n.gamma),
    "Celu": lambda n: (n.alpha, 1.0, n.alpha),
}
for _name, _args in _ELUS.items():
    _unary(_name, lambda t, x, n, args=_args: _elu(t, x, *args(n)))
    _backward(_name, lambda t, o, n, args=_args: {"X": _elu_gradient(t, o["X"], *args(n))})
# gap: sympy's derivative of DaCe's Sigmoid, exp(-x) / (1 + exp(-x))**2, is inf / inf = NaN below x = -88 (floats)
_backward("Sigmoid", lambda t, o, n: {"X": f"__dy * ({t}(1) - __y) * __y"})


FLOATS = (dace.float16, dace.float32, dace.float64)


class ZeroBackward(BackwardImplementation):
    """The derivative of a piecewise constant op (or of a comparison): zero wherever it is defined, as PyTorch's."""

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        body = "".join(zero(f"{n}_grad", forward_in(forward_node, context, n)) for n in required_gradients)
        # autodiff gives a boolean result (a comparison's) no gradient to connect; a numeric one is connected, unread
        given = [n for n in given_gradients if forward_out(forward_node, context, n).dtype != dace.bool_]
        names = [f"{n}_grad" for n in given + list(required_gradients)]
        return cpp_backward(forward_node, context, names, body)


# gap: DaCe's autodiff has no rule for these ops, and fails on the maps of their expansions (boolean results)
for _name in ("Sign", "Floor", "Ceil", "Round", *COMPARISONS, "And", "Or", "Xor", "Not", "IsNaN", "IsInf"):
    autoregister_params(op=_name, name="dcnb")(type(f"{_name}Backward", (ZeroBackward,), {}))
    default_backward(_name)


@autoregister_params(node_type=ONNXOp, name="dcnb_no_gradient")
class NoGradientBackward(ZeroBackward):
    # gap: DaCe's autodiff differentiates everything upstream of the outputs, integer and boolean results too, and
    # fails on the maps of their expansions (a padding mask gathered from attention_mask: BERT)
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        outputs = [sdfg.arrays[e.data.data].dtype for e in state.out_edges(node)]
        return bool(outputs) and all(dtype not in FLOATS for dtype in outputs)


@autoregister_params(op="Identity", name=STOP_GRADIENT)
class StopGradientBackward(ZeroBackward):
    # gap: ONNX has no op that stops gradients, so PyTorch exports ``x.detach()`` as x itself and autodiff
    # differentiated through it; the import marks the Identity that stands for it (``frontend``)
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return node.backward_implementation == STOP_GRADIENT


def _passed_through(forward_node, context, required_gradients, x_name: str):
    """The backward of an op whose output is its input (converted): the output's gradient, as the input's. A map, not
    C++ loops: a GPU runs its elements in parallel (the loops were one thread: 30 of a BERT-base layer's 32 ms of
    kernels on an H200 in training mode, three Dropouts of nothing), and the CPU's map fusion can join neighbours."""
    return _mapped_backward(forward_node, context, required_gradients, lambda t, o, n: {x_name: "__dy"})


@autoregister_params(op="Cast", name="dcnb")
class CastBackward(BackwardImplementation):
    # gap: DaCe's autodiff has no rule for Cast and fails on its expansion's map (a mask's bool to float: Equal)
    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        x, y = forward_in(forward_node, context, "input"), forward_out(forward_node, context, "output")
        if x.dtype not in FLOATS or y.dtype not in FLOATS:
            return ZeroBackward.backward(forward_node, context, given_gradients, required_gradients)
        return _passed_through(forward_node, context, required_gradients, "input")


default_backward("Cast")


@autoregister_params(op="Mod", name="dcnb")
class ModBackward(BackwardImplementation):
    # gap: sympy cannot differentiate Mod's expansion (C++ fmod, or an integer %): a - b * q has derivatives 1 and -q
    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        y = forward_out(forward_node, context, "C")
        if y.dtype not in FLOATS:
            return ZeroBackward.backward(forward_node, context, given_gradients, required_gradients)
        a, b = forward_in(forward_node, context, "A"), forward_in(forward_node, context, "B")
        index = [f"i{k}" for k in range(len(y.shape))]
        head, tail = loops(index, y.shape)
        quotient = f"{at('A', a, broadcast_index(a, y.shape, index))} / {at('B', b, broadcast_index(b, y.shape, index))}"
        body = "".join(zero(f"{n}_grad", forward_in(forward_node, context, n)) for n in required_gradients) + head
        body += f"const auto dy = {at('C_grad', y, index)};\n"
        body += f"const auto q = {'trunc' if forward_node.fmod else 'floor'}({quotient});\n"
        for n, desc, term in (("A", a, "dy"), ("B", b, "-dy * q")):
            if n in required_gradients:
                body += f"{at(f'{n}_grad', desc, broadcast_index(desc, y.shape, index))} += {term};\n"
        body += tail
        return cpp_backward(
            forward_node, context, ["A", "B", "C_grad", *(f"{n}_grad" for n in required_gradients)], body
        )


default_backward("Mod")


def _dropout_constants(node, state, sdfg) -> dict:
    """A Dropout's ``ratio`` and ``training_mode`` inputs, each its constant value (None where it is not one)."""
    return {
        e.dst_conn: onnx_constant_or_none(sdfg, e.src.data)
        for e in state.in_edges(node)
        if e.dst_conn in ("ratio", "training_mode")
    }


def _drops_nothing(node, state, sdfg) -> bool:
    """Whether a Dropout passes its input through: in eval mode, or with a probability of 0 (both constants)."""
    constants = _dropout_constants(node, state, sdfg)
    known = all(c is not None for c in constants.values())
    return known and (not constants.get("training_mode") or constants.get("ratio", 0.5) == 0)


@pure_expansion("Dropout", name="dcnb")
class DropoutPassingThrough(ONNXForward):
    # gap: DaCe's Dropout expansion is host C++ with a function-scope static random state even where nothing is
    # dropped, which a CUDA kernel cannot hold ("dynamic initialization is not supported for a function-scope static
    # __device__ variable"): every transformer's CUDA build failed. Where it drops values, DaCe's runs.
    @staticmethod
    def forward(node, state, sdfg):
        if not _drops_nothing(node, state, sdfg):
            return PureDropout.forward(node, state, sdfg)
        nsdfg = dace.SDFG(f"{node.label}_expansion")
        for edge in (*state.in_edges(node), *state.out_edges(node)):
            desc = copy.deepcopy(sdfg.arrays[edge.data.data])
            desc.transient = False
            nsdfg.add_datadesc(edge.dst_conn or edge.src_conn, desc)
        y = nsdfg.arrays["output"]
        params = [f"__i{k}" for k in range(len(y.shape))] or ["__i0"]
        index = ", ".join(params)
        outputs = {"__y": dace.Memlet(f"output[{index}]")}
        code = "__y = __x"
        if "mask" in node.out_connectors:
            outputs["__m"] = dace.Memlet(f"mask[{index}]")
            code += "\n__m = True"
        nsdfg.add_state().add_mapped_tasklet(
            f"{node.label}_map",
            {p: f"0:{s}" for p, s in zip(params, list(y.shape) or [1])},
            {"__x": dace.Memlet(f"data[{index}]")},
            code,
            outputs,
            external_edges=True,
        )
        return nsdfg


@autoregister_params(op="Dropout", name="dcnb")
class DropoutWithoutMaskBackward(BackwardImplementation):
    # gap: DaCe's Dropout backward needs the mask output, which the exporter leaves out where nothing is dropped
    # (p=0 in training mode, as transformers' configs have it): every transformer in training mode failed
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return "mask" not in node.out_connectors

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        constants = _dropout_constants(forward_node, context.forward_state, context.forward_sdfg)
        if constants.get("training_mode") and constants.get("ratio", 0.5) != 0:
            raise UnsupportedOpError(
                f"{readable(forward_node.label)} drops values in training mode without exporting its mask, so its "
                "gradient cannot be computed; export it with a probability of 0 or in eval mode"
            )
        return _passed_through(forward_node, context, required_gradients, "data")


default_backward("Dropout")


def _clip_backward(forward_node, context, required_gradients, inside: tuple[str, str]):
    """Clip's gradient: the output's where the input is ``inside`` its bounds (``(">=", "<=")``: clamp's)."""
    # a constant bound is written into the code, as the forward's expansion does (nothing stored for it)
    bounds = {
        e.dst_conn: onnx_constant_or_none(context.forward_sdfg, e.src.data)
        for e in context.forward_state.in_edges(forward_node)
        if e.dst_conn in ("min", "max")
    }

    def gradients(t, operands, node):
        tests = [
            f"{operands['input']} {inside[n == 'max']} "
            + (f"{t}({value!r})" if isinstance(value, (int, float)) else operands[n])
            for n, value in bounds.items()
        ]
        return {"input": f"(__dy if {' and '.join(tests) or 'True'} else {t}(0))"}

    # a map, as _passed_through's: C++ loops would run as one thread on a GPU (ReLU6's in MobileNetV2)
    return _mapped_backward(forward_node, context, required_gradients, gradients)


@autoregister_params(op="Clip", name="dcnb")
class ClipBackward(BackwardImplementation):
    # gap: DaCe's Clip backward needs both bounds, as constants (clamp_min crashed with StopIteration)
    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        return _clip_backward(forward_node, context, required_gradients, (">=", "<="))


@autoregister_params(op="Clip", name=HARDTANH)
class HardtanhBackward(BackwardImplementation):
    # gap: ONNX's Clip is clamp's, whose gradient passes at a bound; hardtanh's (ReLU6's) stops there (export_rules)
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return node.backward_implementation == HARDTANH

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        return _clip_backward(forward_node, context, required_gradients, (">", "<"))


default_backward("Clip")


@autoregister_params(op="Where", name="dcnb")
class WhereBackward(BackwardImplementation):
    # gap: DaCe's Where backward assumes X, Y and the condition have the output's shape; masked_fill with a
    # scalar (causal attention's -inf) broadcasts, and its backward failed to parse (incompatible subsets)
    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        cond, out = forward_in(forward_node, context, "condition"), forward_out(forward_node, context, "output")
        wanted = [n for n in ("X", "Y") if n in required_gradients]
        index = [f"i{k}" for k in range(len(out.shape))]
        head, tail = loops(index, out.shape)
        body = "".join(zero(f"{n}_grad", forward_in(forward_node, context, n)) for n in wanted)
        body += head + f"const bool take = {at('condition', cond, broadcast_index(cond, out.shape, index))};\n"
        body += f"const auto dy = {at('output_grad', out, index)};\n"
        for n, when in (("X", "take"), ("Y", "!take")):
            if n in wanted:
                desc = forward_in(forward_node, context, n)
                body += f"if ({when}) {at(f'{n}_grad', desc, broadcast_index(desc, out.shape, index))} += dy;\n"
        body += tail
        return cpp_backward(
            forward_node, context, ["condition", "output_grad", *(f"{n}_grad" for n in wanted)], body
        )


default_backward("Where")
