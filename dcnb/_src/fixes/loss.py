"""Losses: SoftmaxCrossEntropyLoss (log_softmax + nll_loss, cross_entropy) and NegativeLogLikelihoodLoss
(nll_loss), expansions and backward rules."""

from __future__ import annotations

import math

from dace import data as dt
from dace.autodiff.base_abc import BackwardImplementation
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.registry import autoregister_params
from dace.sdfg.utils import in_desc_with_name

from .cpp import contiguous, cpp_backward, cpp_expansion, forward_in, zero
from .registry import default_backward, pure_expansion


def _sce_applies(node, state, sdfg) -> bool:
    return node.reduction in ("mean", "sum", "none") and all(
        contiguous(in_desc_with_name(node, state, sdfg, n)) for n in ("scores", "labels")
    )


def _samples(
    node, scores: dt.Data, per_sample: str, names: tuple[str, str, str] = ("scores", "labels", "weights")
) -> str:
    """C++ visiting every sample of a loss over class scores (N, C, d1, ...) and labels (N, d1, ...), named as
    ``names`` (scores, labels, weights) say: ``per_sample`` sees its index ``s``, its scores at
    ``scores[base + c * rest]``, ``label``, ``w`` (its weight, 0 if its label is ignored), and ``total``, the
    weight a "mean" reduction divides by."""
    score, labels, weights = names
    n, classes = scores.shape[0], scores.shape[1]
    rest = int(math.prod(int(size) for size in scores.shape[2:]))
    ignored = f"label == {node.ignore_index}" if node.ignore_index is not None else "false"
    weight = f"(double){weights}[label]" if weights in node.in_connectors else "1.0"
    samples = f"for (long long s = 0; s < {n * rest}; ++s) {{\nconst long long label = {labels}[s];\n"
    return (
        f"const long long rest = {rest};\ndouble total = 0;\n"
        + samples
        + f"if (!({ignored})) total += {weight};\n}}\n"
        + samples
        + f"const long long base = (s / rest) * {classes} * rest + s % rest;\n"
        + f"const double w = ({ignored}) ? 0.0 : {weight};\n"
        + per_sample
        + "}\n"
    )


def _sce_loops(node, scores: dt.Data, per_sample: str) -> str:
    """``_samples`` over a SoftmaxCrossEntropyLoss, ``per_sample`` also seeing ``lse``, the log of the sum of
    exponentials of the sample's scores."""
    classes = scores.shape[1]
    lse = (
        "double top = scores[base];\n"
        + f"for (long long c = 1; c < {classes}; ++c) top = std::max(top, (double)scores[base + c * rest]);\n"
        + "double sum = 0;\n"
        + f"for (long long c = 0; c < {classes}; ++c) sum += std::exp(scores[base + c * rest] - top);\n"
        + "const double lse = top + std::log(sum);\n"
    )
    return _samples(node, scores, lse + per_sample)


@pure_expansion("SoftmaxCrossEntropyLoss", name="dcnb")
class SoftmaxCrossEntropyLossExpansion(ONNXForward):
    # gap: DaCe's pure SoftmaxCrossEntropyLoss reads the label scores as ``scores[:, labels]``, an N x N block
    # rather than one score per sample, so log_softmax + nll_loss (cross_entropy) gave a wrong loss
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return _sce_applies(node, state, sdfg)

    @staticmethod
    def forward(node, state, sdfg):
        scores = in_desc_with_name(node, state, sdfg, "scores")
        classes = scores.shape[1]
        per_sample = "const double loss = w == 0.0 ? 0.0 : -w * ((double)scores[base + label * rest] - lse);\n"
        if "log_prob" in node.out_connectors:
            per_sample += f"for (long long c = 0; c < {classes}; ++c) log_prob[base + c * rest] = scores[base + c * rest] - lse;\n"
        if node.reduction == "none":
            body = _sce_loops(node, scores, per_sample + "output[s] = loss;\n")
        else:
            body = "double acc = 0;\n" + _sce_loops(node, scores, per_sample + "acc += loss;\n")
            body += f"output[0] = acc{' / total' if node.reduction == 'mean' else ''};\n"
        return cpp_expansion(node, state, sdfg, body)


@autoregister_params(op="SoftmaxCrossEntropyLoss", name="dcnb")
class SoftmaxCrossEntropyLossBackward(BackwardImplementation):
    # gap: DaCe has no backward for SoftmaxCrossEntropyLoss (log_softmax + nll_loss, cross_entropy): autodiff
    # failed on the label lookup of its expansion ("Failed at node indirection")
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return _sce_applies(node, state, sdfg)

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        scores = forward_in(forward_node, context, "scores")
        classes = scores.shape[1]
        given = [g for g in ("output", "log_prob") if g in given_gradients]
        per_sample = ""
        if "output" in given:
            scale = {"none": "output_grad[s]", "sum": "output_grad[0]", "mean": "output_grad[0] / total"}
            per_sample += f"const double up = w * {scale[forward_node.reduction]};\n"
        if "log_prob" in given:
            per_sample += f"double lp = 0;\nfor (long long c = 0; c < {classes}; ++c) lp += log_prob_grad[base + c * rest];\n"
        per_sample += (
            f"for (long long c = 0; c < {classes}; ++c) {{\n"
            + "const double p = std::exp(scores[base + c * rest] - lse);\ndouble g = 0;\n"
            + ("g += up * (p - (c == label ? 1.0 : 0.0));\n" if "output" in given else "")
            + ("g += log_prob_grad[base + c * rest] - p * lp;\n" if "log_prob" in given else "")
            + "scores_grad[base + c * rest] = g;\n}\n"
        )
        names = ["scores", "labels", *(["weights"] if "weights" in forward_node.in_connectors else [])]
        names += [f"{g}_grad" for g in given] + ["scores_grad"]
        return cpp_backward(forward_node, context, names, _sce_loops(forward_node, scores, per_sample))


default_backward("SoftmaxCrossEntropyLoss")


_NLL = ("input", "target", "weight")


def _nll_applies(node, state, sdfg) -> bool:
    scores = in_desc_with_name(node, state, sdfg, "input")
    return (
        node.reduction in ("mean", "sum", "none")
        and len(scores.shape) >= 2  # (N, C, ...): not one sample's (C,)
        and all(contiguous(in_desc_with_name(node, state, sdfg, n)) for n in ("input", "target"))
    )


@pure_expansion("NegativeLogLikelihoodLoss")
class NegativeLogLikelihoodLossExpansion(ONNXForward):
    # gap: DaCe has no implementation of the ONNX op NegativeLogLikelihoodLoss (F.nll_loss, nn.NLLLoss)
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return _nll_applies(node, state, sdfg)

    @staticmethod
    def forward(node, state, sdfg):
        scores = in_desc_with_name(node, state, sdfg, "input")
        # ``term``, not ``loss``: that is the output's name
        per_sample = "const double term = w == 0.0 ? 0.0 : -w * (double)input[base + label * rest];\n"
        if node.reduction == "none":
            body = _samples(node, scores, per_sample + "loss[s] = term;\n", _NLL)
        else:
            body = "double acc = 0;\n" + _samples(node, scores, per_sample + "acc += term;\n", _NLL)
            body += f"loss[0] = acc{' / total' if node.reduction == 'mean' else ''};\n"
        return cpp_expansion(node, state, sdfg, body)


@autoregister_params(op="NegativeLogLikelihoodLoss", name="dcnb")
class NegativeLogLikelihoodLossBackward(BackwardImplementation):
    # gap: DaCe has no backward for NegativeLogLikelihoodLoss: each sample's gradient is -w (scaled as the loss is
    # reduced) at its label's score, 0 elsewhere
    @staticmethod
    def backward_can_be_applied(node, state, sdfg) -> bool:
        return _nll_applies(node, state, sdfg)

    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        scores = forward_in(forward_node, context, "input")
        scale = {"none": "loss_grad[s]", "sum": "loss_grad[0]", "mean": "loss_grad[0] / total"}[forward_node.reduction]
        per_sample = f"if (w != 0.0) input_grad[base + label * rest] = -w * {scale};\n"
        body = zero("input_grad", scores) + _samples(forward_node, scores, per_sample, _NLL)
        names = ["target", *(["weight"] if "weight" in forward_node.in_connectors else []), "loss_grad", "input_grad"]
        return cpp_backward(forward_node, context, names, body)


default_backward("NegativeLogLikelihoodLoss")
