"""Symbolics for aten ops that PyTorch's TorchScript ONNX exporter cannot export (or refuses with these arguments),
written as standard ONNX ops that DaCe (with dcnb's fixes) imports and differentiates.

Each registers with ``@symbolic(op)`` beside it, and ``register`` hands them to ``register_custom_op_symbolic`` at
the export's opset, where a custom symbolic takes precedence over PyTorch's own. More hold only during dcnb's exports
(``own_exports``) and write ops of dcnb's own domain (``OWN_OPS``), which the import makes standard ops with a backward
rule of their own: ``detach``'s and ``embedding``'s mark where gradients stop, ``hardtanh``'s and ``relu6``'s are
clips whose gradient stops at their bounds.
"""

from __future__ import annotations

import contextlib
import string
from collections.abc import Callable

import torch
from onnx import TensorProto
from torch.onnx import errors, symbolic_helper

#: aten's Reduction enum, by value
_REDUCTIONS = ("none", "mean", "sum")
_DTYPES = {"Float": torch.float32, "Double": torch.float64, "Half": torch.float16, "BFloat16": torch.bfloat16}

#: aten op -> its symbolic, registered for every export (``register``)
_RULES: dict[str, Callable] = {}
#: aten op -> its symbolic, registered during dcnb's exports only (``own_exports``)
_OWN: dict[str, Callable] = {}


def symbolic(op: str, own: bool = False) -> Callable[[Callable], Callable]:
    """Register the decorated function as ``op``'s symbolic (put it above ``parse_args``, which wraps it); ``own``:
    during dcnb's exports only."""
    table = _OWN if own else _RULES

    def add(function: Callable) -> Callable:
        if op in table:
            raise ValueError(f"two symbolics for {op}: {table[op].__name__} and {function.__name__}")
        table[op] = function
        return function

    return add


def register(opset: int) -> None:
    """Register the symbolics for exports at ``opset`` (at least 18: reductions take their axes as an input). They
    stay registered: PyTorch's exporter fails with a ValueError on an op whose symbolics were all unregistered, where
    it refused the op with its reason before; the user's own exports of these ops now succeed too."""
    for name, function in _RULES.items():
        torch.onnx.register_custom_op_symbolic(name, function, opset)


#: dcnb's own ONNX domain
DOMAIN = "dcnb"
#: the backward rules of the standard ops the import makes of dcnb's own
STOP_GRADIENT, HARDTANH = "dcnb_stop_gradient", "dcnb_hardtanh"
#: dcnb's own op -> the standard op the import makes of it, and that op's backward rule
OWN_OPS = {"StopGradient": ("Identity", STOP_GRADIENT), "Hardtanh": ("Clip", HARDTANH)}


@contextlib.contextmanager
def own_exports(opset: int):
    """dcnb's own symbolics registered for the duration; afterwards the user's own exports get PyTorch's again."""
    for name, function in _OWN.items():
        torch.onnx.register_custom_op_symbolic(name, function, opset)
    try:
        yield
    finally:
        for name in _OWN:
            torch.onnx.unregister_custom_op_symbolic(name, opset)


def _own(g, op: str, *inputs):
    output = g.op(f"{DOMAIN}::{op}", *inputs)
    output.setType(inputs[0].type())
    return output


@symbolic("aten::detach", own=True)
def _stop_gradient(g, input):
    # gap: PyTorch exports x.detach() as x itself, and autodiff differentiated through it (``y - y.detach().mean()``,
    # a straight-through estimator)
    return _own(g, "StopGradient", input)


@symbolic("aten::hardtanh", own=True)
@symbolic_helper.parse_args("v", "f", "f")
def _hardtanh(g, input, min_val: float, max_val: float):
    # gap: PyTorch exports hardtanh (ReLU6) as Clip, clamp's op, whose gradient passes at a bound where hardtanh's
    # stops: MobileNetV2's ReLU6 over an exact 0 or 6 had its naive step refused
    return _own(g, "Hardtanh", input, _scalar(g, min_val, input), _scalar(g, max_val, input))


@symbolic("aten::relu6", own=True)
def _relu6(g, input):
    return _hardtanh(g, input, 0.0, 6.0)


@symbolic("aten::embedding", own=True)
@symbolic_helper.parse_args("v", "v", "i", "b", "b")
def _embedding(g, weight, indices, padding_idx: int, scale_grad_by_freq: bool, sparse: bool):
    # gap: PyTorch exports an embedding as a plain Gather, which has no padding row: the padding tokens' gradients
    # went into it (zeroing the row afterwards also dropped what a tied output layer adds to it: BART, Marian)
    if scale_grad_by_freq:
        raise errors.SymbolicValueError(
            "an embedding with scale_grad_by_freq=True scales gradients ONNX cannot", weight
        )
    looked_up = g.op("Gather", weight, indices)
    if padding_idx < 0:
        return looked_up
    row = g.op("Constant", value_t=torch.tensor(padding_idx, dtype=torch.int64))
    padding = g.op("Equal", g.op("Cast", indices, to_i=TensorProto.INT64), row)
    return g.op("Where", g.op("Unsqueeze", padding, _axes(g, [-1])), _stop_gradient(g, looked_up), looked_up)


def _dtype(value) -> torch.dtype:
    return _DTYPES.get(value.type().scalarType(), torch.float32)


def _scalar(g, number: float, like):
    """A constant of ``like``'s float type: a float64 constant would make float32 arithmetic double."""
    return g.op("Constant", value_t=torch.tensor(number, dtype=_dtype(like)))


def _axes(g, axes: list[int]):
    return g.op("Constant", value_t=torch.tensor(axes, dtype=torch.int64))


def _reduce(g, loss, reduction: int):
    """A loss' elements reduced as aten's ``reduction`` says: kept, their mean or their sum."""
    kind = _REDUCTIONS[reduction]
    if kind == "none":
        return loss
    return g.op("ReduceMean" if kind == "mean" else "ReduceSum", loss, keepdims_i=0)


@symbolic("aten::l1_loss")
@symbolic_helper.parse_args("v", "v", "i")
def l1_loss(g, input, target, reduction: int):
    # gap: PyTorch cannot export aten::l1_loss (F.l1_loss, nn.L1Loss)
    return _reduce(g, g.op("Abs", g.op("Sub", input, target)), reduction)


def _huber(g, input, target, reduction: int, delta: float, scale: float):
    """``scale`` * (0.5 d^2 / delta where |d| < delta, else |d| - 0.5 delta), d = input - target; |d| for
    delta 0. Huber is smooth L1 scaled by delta.

    Written as 0.5 m^2 / delta + |d| - m with m = min(|d|, delta), not as a Where of the two cases: the gradient of
    the case a Where leaves out is 0 times that case's derivative, NaN for an infinite d."""
    absolute = g.op("Abs", g.op("Sub", input, target))
    if delta == 0:
        return _reduce(g, absolute, reduction)
    inside = g.op("Min", absolute, _scalar(g, delta, input))
    square = g.op("Mul", g.op("Mul", inside, inside), _scalar(g, 0.5 / delta, input))
    loss = g.op("Add", square, g.op("Sub", absolute, inside))
    return _reduce(g, loss if scale == 1 else g.op("Mul", loss, _scalar(g, scale, input)), reduction)


@symbolic("aten::smooth_l1_loss")
@symbolic_helper.parse_args("v", "v", "i", "f")
def smooth_l1_loss(g, input, target, reduction: int, beta: float):
    # gap: PyTorch cannot export aten::smooth_l1_loss (F.smooth_l1_loss, nn.SmoothL1Loss)
    return _huber(g, input, target, reduction, beta, 1.0)


@symbolic("aten::huber_loss")
@symbolic_helper.parse_args("v", "v", "i", "f")
def huber_loss(g, input, target, reduction: int, delta: float):
    # gap: PyTorch cannot export aten::huber_loss (F.huber_loss, nn.HuberLoss)
    return _huber(g, input, target, reduction, delta, delta)


def _log_sigmoid(g, input):
    """log(sigmoid(x)) as min(x, 0) - log(1 + exp(-|x|)), where no exponential overflows."""
    one = _scalar(g, 1.0, input)
    tail = g.op("Log", g.op("Add", one, g.op("Exp", g.op("Neg", g.op("Abs", input)))))
    return g.op("Sub", g.op("Min", input, _scalar(g, 0.0, input)), tail)


@symbolic("aten::log_sigmoid")
@symbolic_helper.parse_args("v")
def log_sigmoid(g, input):
    # gap: PyTorch exports F.logsigmoid as log(sigmoid(x)): -inf below x = -104 (floats), where eager's is x
    return _log_sigmoid(g, input)


@symbolic("aten::binary_cross_entropy_with_logits")
@symbolic_helper.parse_args("v", "v", "v", "v", "i")
def binary_cross_entropy_with_logits(g, input, target, weight, pos_weight, reduction: int):
    # gap: PyTorch exports it with log(sigmoid(x)) and log(1 - sigmoid(x)): inf beyond |x| = 88 (floats), where
    # eager's loss, (1 - t) x - w log(sigmoid(x)) with w = (pos_weight - 1) t + 1, is finite
    one = _scalar(g, 1.0, input)
    log_sigmoid = _log_sigmoid(g, input)
    if not pos_weight.node().mustBeNone():
        log_sigmoid = g.op("Mul", log_sigmoid, g.op("Add", g.op("Mul", g.op("Sub", pos_weight, one), target), one))
    loss = g.op("Sub", g.op("Mul", g.op("Sub", one, target), input), log_sigmoid)
    if not weight.node().mustBeNone():
        loss = g.op("Mul", weight, loss)
    return _reduce(g, loss, reduction)


@symbolic("aten::kl_div")
@symbolic_helper.parse_args("v", "v", "i", "b")
def kl_div(g, input, target, reduction: int, log_target: bool):
    # gap: PyTorch exports kl_div as where(target > 0, target * (log(target) - input), 0): 0 for a NaN target (and
    # for a zero target beside an infinite input), where eager's xlogy(target, target) - target * input is NaN
    if log_target:
        loss = g.op("Mul", g.op("Exp", target), g.op("Sub", target, input))
    else:
        # xlogy(t, t): 0 where t is 0, t * log(t) elsewhere (NaN for NaN); its gradient is NaN at 0, as eager's
        zero = g.op("Equal", target, _scalar(g, 0.0, target))
        xlogy = g.op("Where", zero, _scalar(g, 0.0, target), g.op("Mul", target, g.op("Log", target)))
        loss = g.op("Sub", xlogy, g.op("Mul", target, input))
    return _reduce(g, loss, reduction)


@symbolic("aten::rms_norm")
@symbolic_helper.parse_args("v", "is", "v", "f")
def rms_norm(g, input, normalized_shape: list[int], weight, eps: float | None):
    # gap: PyTorch cannot export aten::rms_norm (nn.RMSNorm, F.rms_norm) at opset 18
    if eps is None:  # PyTorch's default: the machine epsilon of the input's type
        eps = torch.finfo(_dtype(input)).eps
    axes = _axes(g, list(range(-len(normalized_shape), 0)))
    mean_square = g.op("ReduceMean", g.op("Mul", input, input), axes, keepdims_i=1)
    normalized = g.op("Div", input, g.op("Sqrt", g.op("Add", mean_square, _scalar(g, eps, input))))
    return normalized if weight.node().mustBeNone() else g.op("Mul", normalized, weight)


@symbolic("aten::cross_entropy_loss")
@symbolic_helper.parse_args("v", "v", "v", "i", "i", "f")
def cross_entropy_loss(g, scores, target, weight, reduction: int, ignore_index: int, label_smoothing: float):
    # gap: PyTorch's exporter refuses cross_entropy's label_smoothing ("ONNX does not support label_smoothing")
    weighted = not weight.node().mustBeNone()
    loss = g.op(
        "SoftmaxCrossEntropyLoss",
        *([scores, target, weight] if weighted else [scores, target]),
        reduction_s=_REDUCTIONS[reduction],
        ignore_index_i=ignore_index,
    )
    if not label_smoothing:
        return loss
    rank, sizes = scores.type().dim(), scores.type().sizes()
    if rank is None or rank < 2 or not sizes or target.type().scalarType() not in ("Long", "Int"):
        raise errors.SymbolicValueError(
            "Unsupported: label_smoothing needs scores of a known shape (N, C, ...) and class indices as targets",
            scores,
        )
    smoothing = _label_smoothing(g, scores, target, weight if weighted else None, reduction, ignore_index, rank)
    # as PyTorch: (1 - eps) * the loss + eps / C * the mean over classes of the (weighted) negative log-probability
    return g.op(
        "Add",
        g.op("Mul", loss, _scalar(g, 1 - label_smoothing, scores)),
        g.op("Mul", smoothing, _scalar(g, label_smoothing / sizes[1], scores)),
    )


def _label_smoothing(g, scores, target, weight, reduction: int, ignore_index: int, rank: int):
    """The sum over classes of -(weight *) log_softmax(scores), 0 for ignored targets, reduced as the loss is: its
    mean divides by the (weighted) count of the targets kept, as nll_loss' does."""
    log_prob = g.op("LogSoftmax", scores, axis_i=1)
    if weight is not None:
        per_class = g.op("Reshape", weight, _axes(g, [-1] + [1] * (rank - 2)))
        log_prob = g.op("Mul", log_prob, per_class)
    per_sample = g.op("Neg", g.op("ReduceSum", log_prob, _axes(g, [1]), keepdims_i=0))
    kept = g.op("Not", g.op("Equal", target, g.op("Constant", value_t=torch.tensor(ignore_index))))
    zero = _scalar(g, 0.0, scores)
    per_sample = g.op("Where", kept, per_sample, zero)
    kind = _REDUCTIONS[reduction]
    if kind == "none":
        return per_sample
    total = g.op("ReduceSum", per_sample, keepdims_i=0)
    if kind == "sum":
        return total
    if weight is None:
        count = g.op("Cast", kept, to_i=_onnx_type(scores))
    else:
        safe = g.op("Where", kept, target, g.op("Constant", value_t=torch.tensor(0)))
        count = g.op("Where", kept, g.op("Gather", weight, safe, axis_i=0), zero)
    return g.op("Div", total, g.op("ReduceSum", count, keepdims_i=0))


@symbolic("aten::bilinear")
def bilinear(g, input1, input2, weight, bias):
    # gap: PyTorch cannot export aten::bilinear (nn.Bilinear): y[..., o] = x1[..., i] W[o, i, j] x2[..., j] + b[o],
    # written as one matrix product of x1 with W laid out (i, o * j), then a product with x2 summed over j
    sizes = weight.type().sizes()
    if not sizes or len(sizes) != 3:
        raise errors.SymbolicValueError("Unsupported: bilinear needs a weight of known shape (out, in1, in2)", weight)
    out, in1, in2 = sizes
    rows1 = g.op("Reshape", input1, _axes(g, [-1, in1]))
    rows2 = g.op("Reshape", input2, _axes(g, [-1, 1, in2]))
    laid_out = g.op("Reshape", g.op("Transpose", weight, perm_i=[1, 0, 2]), _axes(g, [in1, out * in2]))
    products = g.op("Reshape", g.op("MatMul", rows1, laid_out), _axes(g, [-1, out, in2]))
    result = g.op("ReduceSum", g.op("Mul", products, rows2), _axes(g, [2]), keepdims_i=0)
    if not bias.node().mustBeNone():
        result = g.op("Add", result, bias)
    # back to the inputs' leading dimensions
    leading = g.op("Slice", g.op("Shape", input1), _axes(g, [0]), _axes(g, [-1]))
    return g.op("Reshape", result, g.op("Concat", leading, _axes(g, [out]), axis_i=0))


@symbolic("aten::diff")
@symbolic_helper.parse_args("v", "i", "i", "v", "v")
def diff(g, input, n: int, dim: int, prepend, append):
    # gap: PyTorch cannot export aten::diff (torch.diff; transformers' masks look for packed sequences with it)
    parts = [t for t in (prepend, input, append) if not symbolic_helper._is_none(t)]
    x = g.op("Concat", *parts, axis_i=dim) if len(parts) > 1 else input
    axes = _axes(g, [dim])
    for _ in range(n):
        later = g.op("Slice", x, _axes(g, [1]), _axes(g, [torch.iinfo(torch.int64).max]), axes)
        earlier = g.op("Slice", x, _axes(g, [0]), _axes(g, [-1]), axes)
        # (booleans differ where they are not equal, as torch.diff has it)
        x = g.op("Xor" if input.type().scalarType() == "Bool" else "Sub", later, earlier)
    return x


@symbolic("aten::one_hot")
@symbolic_helper.parse_args("v", "i")
def one_hot(g, input, num_classes: int):
    # gap: PyTorch exports F.one_hot as ONNX's OneHot, which DaCe lacks and whose depth, an input, leaves its shape
    # unknown to the import; a comparison with each class' index is the same
    if num_classes < 0:
        raise errors.SymbolicValueError(
            "F.one_hot needs num_classes: without it the shape depends on the values", input
        )
    classes = g.op("Constant", value_t=torch.arange(num_classes, dtype=torch.int64))
    equal = g.op("Equal", g.op("Unsqueeze", input, _axes(g, [-1])), classes)
    return g.op("Cast", equal, to_i=TensorProto.INT64)


@symbolic("aten::cumsum")
@symbolic_helper.parse_args("v", "i", "none")
def cumsum(g, input, dim: int, dtype):
    # gap: PyTorch exports the running sum of booleans (or of narrower integers) as a CumSum of that type, which ONNX
    # has none of for booleans and which torch sums in int64 (transformers' masks count packed sequences so)
    if not symbolic_helper._is_none(dtype):
        scalar = symbolic_helper._type_utils.JitScalarType(symbolic_helper._get_const(dtype, "i", "dtype"))
        input = g.op("Cast", input, to_i=scalar.onnx_type())
    elif input.type().scalarType() in ("Bool", "Byte", "Char", "Short", "Int"):
        input = g.op("Cast", input, to_i=TensorProto.INT64)
    return g.op("CumSum", input, g.op("Constant", value_t=torch.tensor(dim, dtype=torch.int64)))


@symbolic("aten::matmul")
@symbolic_helper.parse_args("v", "v")
def matmul(g, a, b):
    # gap: DaCe's MatMul gives batch axes one letter in its Einsum, so a batch axis of size 1 against more
    # (``(1, m, k) @ (b, k, n)``) fails to build, and it has no product of two vectors: such products are written
    # as the einsums they are
    shapes = [symbolic_helper._get_tensor_sizes(t) for t in (a, b)]
    if any(not s or None in s for s in shapes):
        return g.op("MatMul", a, b)
    if len(shapes[0]) == len(shapes[1]) == 1:
        return dot(g, a, b)
    if min(map(len, shapes)) > 2 and any(1 in (x, y) and x != y for x, y in zip(shapes[0][-3::-1], shapes[1][-3::-1])):
        return _einsum(g, "...ik,...kj->...ij", [a, b])
    return g.op("MatMul", a, b)


@symbolic("aten::dot")
@symbolic_helper.parse_args("v", "v")
def dot(g, a, b):
    # gap: PyTorch exports torch.dot as a MatMul of two vectors, which DaCe's MatMul refuses
    return _einsum(g, "i,i->", [a, b])


@symbolic("aten::einsum")
@symbolic_helper.parse_args("s", "v", "is")
def einsum(g, equation: str, tensor_list, path=None):
    return _einsum(g, equation, symbolic_helper._unpack_list(tensor_list))


def _einsum(g, equation: str, tensors: list):
    # gap: DaCe imports an Einsum only with its result written out and no ellipsis, and its backward gives garbage
    # or fails to build where an operand repeats a letter (a diagonal), sums a letter no other term has, or the
    # result is a scalar: the equation is rewritten so that none of these reach it
    shapes = [symbolic_helper._get_tensor_sizes(t) for t in tensors]
    if any(shape is None or None in shape for shape in shapes):
        # the rewrites below need the shapes (Funnel's relative attention has none): the equation as written
        inputs, arrow, result = equation.replace(" ", "").partition("->")
        if not arrow or "." in inputs:
            raise errors.SymbolicValueError("Unsupported: an einsum over inputs of unknown shape", tensors[0])
        return _product(g, list(zip(inputs.split(","), tensors)), result)
    terms, result = _written_out(equation, shapes)
    boolean = symbolic_helper._is_bool(tensors[0])
    dtype = torch.int64 if boolean else tensors[0].type().dtype()
    if boolean:  # (as PyTorch's own symbolic: ONNX has no Einsum of booleans)
        tensors = [g.op("Cast", t, to_i=TensorProto.INT64) for t in tensors]
    spare = [c for c in string.ascii_letters if c not in "".join(terms)]
    operands = []  # [term, tensor, shape]
    for term, tensor, shape in zip(terms, tensors, shapes):
        letters = list(term)
        for k, letter in enumerate(term):
            if letter in term[:k]:  # a diagonal: the repeat becomes a letter of its own, equal to it through eye
                letters[k] = spare.pop(0)
                eye = g.op("Constant", value_t=torch.eye(shape[k], dtype=dtype))
                operands.append([letter + letters[k], eye, [shape[k]] * 2])
        operands.append(["".join(letters), tensor, list(shape)])
    largest: dict[str, int] = {}
    for term, _, shape in operands:
        for letter, size in zip(term, shape):
            largest[letter] = max(largest.get(letter, 1), size)
    # an axis broadcast (size 1 against more) adds nothing, and a letter no other term has is summed over first
    # (a sum, not a squeeze: DaCe's Einsum backward cannot write through a view)
    broadcast = [{k for k, c in enumerate(term) if shape[k] == 1 < largest[c]} for term, _, shape in operands]
    left = ["".join(c for k, c in enumerate(o[0]) if k not in b) for o, b in zip(operands, broadcast)]
    for index, operand in enumerate(operands):
        term, tensor, _ = operand
        others = result + "".join(t for k, t in enumerate(left) if k != index)
        summed = sorted(broadcast[index] | {k for k, c in enumerate(term) if c not in others})
        if summed:
            tensor = g.op("ReduceSum", tensor, _axes(g, summed), keepdims_i=0)
        operand[:] = ["".join(c for k, c in enumerate(term) if k not in summed), tensor, None]
    scalars = [tensor for term, tensor, _ in operands if not term]
    operands = [(term, tensor) for term, tensor, _ in operands if term]
    if len(operands) == 1:  # (every letter left is the result's)
        term, out = operands[0]
        if term != result:
            out = g.op("Transpose", out, perm_i=[term.index(c) for c in result])
    elif operands:
        unit = "" if result else spare.pop(0)  # (a scalar result as one of one element: DaCe's backward needs an axis)
        if unit:
            operands.append((unit, g.op("Constant", value_t=torch.ones(1, dtype=dtype))))
        out = _product(g, operands, unit + result)
        if unit:
            out = g.op("Squeeze", out, _axes(g, [0]))
    else:
        out = scalars.pop()
    for scalar in scalars:
        out = g.op("Mul", out, scalar)
    return g.op("Cast", out, to_i=TensorProto.BOOL) if boolean else out


def _product(g, operands: list, result: str):
    """One Einsum of ``operands``, (term, tensor) pairs, into ``result``: batch axes first (``_batch_first``), then
    transposed into ``result``'s order; its letters lower-cased, as ONNX's Einsum takes them."""
    operands, order = _batch_first(g, operands, result)
    used = dict.fromkeys("".join(t for t, _ in operands))
    if len(used) > len(string.ascii_lowercase):
        raise errors.SymbolicValueError(
            f"Unsupported: an einsum of {len(used)} letters (ONNX's has 26)", operands[0][1]
        )
    lower = dict(zip(used, string.ascii_lowercase))
    written = ",".join("".join(lower[c] for c in t) for t, _ in operands) + "->" + "".join(lower[c] for c in order)
    out = g.op("Einsum", *(t for _, t in operands), equation_s=written)
    return out if order == result else g.op("Transpose", out, perm_i=[order.index(c) for c in result])


def _batch_first(g, operands: list, result: str) -> tuple[list, str]:
    """A product of two operands with their batch letters (those of both and of the result) first, in the result's
    order, each operand transposed where it has them elsewhere; returns the operands and the order of the result to
    compute (batch letters first), which the caller transposes into ``result``.

    gap: DaCe's einsum takes a batched GEMM whose operands have the batch axes after another one for one whose
    batch axes lead, and reads garbage (XLNet's ``ibnd,jbnd->bnij``: infinities, then a corrupted heap)
    """
    if len(operands) != 2:
        return operands, result
    batch = [c for c in result if all(c in term for term, _ in operands)]
    if not batch:
        return operands, result
    moved = []
    for term, tensor in operands:
        first = "".join(batch) + "".join(c for c in term if c not in batch)
        if first != term:
            tensor = g.op("Transpose", tensor, perm_i=[term.index(c) for c in first])
        moved.append((first, tensor))
    return moved, "".join(batch) + "".join(c for c in result if c not in batch)


def _written_out(equation: str, shapes: list) -> tuple[list[str], str]:
    """An einsum's equation as torch reads it: each operand's letters, one per axis (an ellipsis as letters of its
    own, aligned from the right), and the result's (implicit: the ellipsis, then the letters used once, sorted)."""
    inputs, arrow, result = equation.replace(" ", "").partition("->")
    terms = inputs.split(",")
    spare = [c for c in string.ascii_letters if c not in inputs]
    widths = [len(shape) - len(term) + 3 for term, shape in zip(terms, shapes) if "..." in term]
    ellipsis = "".join(spare[: max(widths, default=0)])
    terms = [t.replace("...", ellipsis[len(ellipsis) - (len(s) - len(t) + 3) :]) for t, s in zip(terms, shapes)]
    if not arrow:
        named = inputs.replace("...", "").replace(",", "")
        result = "..." + "".join(sorted(c for c in set(named) if named.count(c) == 1))
    return terms, result.replace("...", ellipsis)


# gap: PyTorch exports nn.LSTM, nn.GRU and nn.RNN as ONNX's LSTM, GRU and RNN, which DaCe has no implementation of
# (nor autodiff a loop): they are unrolled over the time steps into products and pointwise ops. The inputs' products
# with the weights are one matrix product for all steps; each step adds the hidden state's product.


@symbolic("aten::lstm")
def lstm(g, input, hidden, weights, *flags):
    return _rnn(g, "LSTM", input, symbolic_helper._unpack_list(hidden), weights, flags)


@symbolic("aten::gru")
def gru(g, input, hidden, weights, *flags):
    return _rnn(g, "GRU", input, [hidden], weights, flags)


@symbolic("aten::rnn_tanh")
def rnn_tanh(g, input, hidden, weights, *flags):
    return _rnn(g, "Tanh", input, [hidden], weights, flags)


@symbolic("aten::rnn_relu")
def rnn_relu(g, input, hidden, weights, *flags):
    return _rnn(g, "Relu", input, [hidden], weights, flags)


#: the most cell steps an RNN is unrolled into: build time grows faster than their number (a one-layer LSTM over 32
#: steps: 89 s to its naive step, import 22 s, autodiff 17 s, compile 50 s; over 64: 294 s)
_MOST_CELLS = 32
#: the gates of each kind of cell, as many blocks of the hidden size in its weights' rows
_GATES = {"LSTM": 4, "GRU": 3, "Tanh": 1, "Relu": 1}


def _rnn(g, kind: str, input, hidden: list, weights, flags: tuple):
    if symbolic_helper._is_tensor_list(flags[0]):  # (input, batch_sizes, hidden, weights, ...): a packed sequence
        raise errors.SymbolicValueError("Unsupported: a packed sequence (pack_padded_sequence) into an RNN", input)
    has_biases, layers, dropout, train, bidirectional, batch_first = (
        symbolic_helper._parse_arg(v, t) for v, t in zip(flags, "iifiii")
    )
    if dropout and train and layers > 1:
        raise errors.SymbolicValueError("Unsupported: dropout between an RNN's layers in training mode", input)
    weights = symbolic_helper._unpack_list(weights)
    directions = 2 if bidirectional else 1
    per = len(weights) // (layers * directions)
    if per != (4 if has_biases else 2):
        raise errors.SymbolicValueError("Unsupported: an LSTM with proj_size", input)
    sizes = input.type().sizes()
    if not sizes or None in sizes:
        raise errors.SymbolicValueError("Unsupported: an RNN over inputs of unknown shape", input)
    steps = sizes[1] if batch_first else sizes[0]
    cells = layers * directions * steps
    if cells > _MOST_CELLS:
        raise errors.SymbolicValueError(
            f"Unsupported: an RNN of {cells} cell steps ({layers} layers x {directions} directions x {steps} time "
            f"steps): dcnb unrolls an RNN over its steps, and builds {_MOST_CELLS} at most (an LSTM's naive step of "
            "32 takes 90 s here)",
            input,
        )
    x = g.op("Transpose", input, perm_i=[1, 0, 2]) if batch_first else input  # (steps, batch, features)
    last = {name: [] for name in ("h", "c")}
    for layer in range(layers):
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            w_ih, w_hh, *biases = weights[index * per : (index + 1) * per]
            b_ih, b_hh = biases or (None, None)
            state = [g.op("Gather", h, _axes(g, index), axis_i=0) for h in hidden]  # (batch, hidden) each
            size = w_hh.type().sizes()[1]
            # every step's input product at once: (steps * batch, features) x (features, gates * hidden)
            rows = g.op("Reshape", x, _axes(g, [-1, sizes[2] if layer == 0 else directions * size]))
            products = _linear(g, rows, w_ih, b_ih)
            products = g.op("Reshape", products, _axes(g, [steps, -1, _GATES[kind] * size]))
            order = range(steps) if direction == 0 else reversed(range(steps))
            out = [None] * steps
            for t in order:
                step = g.op("Gather", products, _axes(g, t), axis_i=0)
                state = _cell(g, kind, step, _linear(g, state[0], w_hh, b_hh), state)
                out[t] = g.op("Unsqueeze", state[0], _axes(g, [0]))
            outputs.append(g.op("Concat", *out, axis_i=0))
            for name, value in zip(("h", "c"), state):
                last[name].append(g.op("Unsqueeze", value, _axes(g, [0])))
        x = outputs[0] if directions == 1 else g.op("Concat", *outputs, axis_i=2)
    output = g.op("Transpose", x, perm_i=[1, 0, 2]) if batch_first else x
    finals = [g.op("Concat", *last[name], axis_i=0) for name in ("h", "c")[: len(hidden)]]
    return (output, *finals)


def _linear(g, x, weight, bias):
    """x W^T + b, for ``x`` of two axes."""
    product = g.op("MatMul", x, g.op("Transpose", weight, perm_i=[1, 0]))
    return product if bias is None else g.op("Add", product, bias)


def _cell(g, kind: str, x, h, state: list) -> list:
    """One step of a cell: its input's and its hidden state's products (gates laid out as PyTorch's weights are)
    -> the new state ([hidden] or an LSTM's [hidden, cell])."""
    if kind in ("Tanh", "Relu"):
        return [g.op(kind, g.op("Add", x, h))]
    if kind == "LSTM":
        i, f, c, o = _split(g, g.op("Add", x, h), 4)
        cell = g.op("Add", g.op("Mul", g.op("Sigmoid", f), state[1]), g.op("Mul", g.op("Sigmoid", i), g.op("Tanh", c)))
        return [g.op("Mul", g.op("Sigmoid", o), g.op("Tanh", cell)), cell]
    (xr, xz, xn), (hr, hz, hn) = _split(g, x, 3), _split(g, h, 3)
    reset, update = g.op("Sigmoid", g.op("Add", xr, hr)), g.op("Sigmoid", g.op("Add", xz, hz))
    new = g.op("Tanh", g.op("Add", xn, g.op("Mul", reset, hn)))
    # (1 - z) n + z h
    return [g.op("Add", new, g.op("Mul", update, g.op("Sub", state[0], new)))]


def _split(g, x, parts: int) -> list:
    return list(g.op("Split", x, axis_i=1, num_outputs_i=parts, outputs=parts))


def _onnx_type(value) -> int:
    """The ONNX element type of ``value``'s float type (Cast's ``to``)."""
    return {
        torch.float32: TensorProto.FLOAT,
        torch.float64: TensorProto.DOUBLE,
        torch.float16: TensorProto.FLOAT16,
        torch.bfloat16: TensorProto.BFLOAT16,
    }[_dtype(value)]
