"""Sorting: TopK (torch.topk, torch.sort and argsort, which PyTorch exports as it), forward and backward, as C++ that
orders each row's indices with the standard library's partial sort."""

from __future__ import annotations

from dace.autodiff.base_abc import BackwardImplementation
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.libraries.onnx.schema import ONNXParameterType
from dace.registry import autoregister_params
from dace.sdfg.utils import in_desc_with_name, out_desc_with_name

from .cpp import cpp_backward, cpp_expansion, forward_in, forward_out, loops, offset, zero
from .registry import default_backward, op_versions, pure_expansion

# gap: DaCe's validation wants both of TopK's outputs connected, and simplify removes the one nothing reads (the
# indices of torch.topk(x, k).values, the values of argsort); the expansion writes those there are
for _cls in op_versions("TopK"):
    for _output in _cls.schema.outputs:
        _output.param_type = ONNXParameterType.Optional


def _ordered(node, x, values, inside: str) -> str:
    """C++ over each row of ``x`` along the node's axis: ``order``, its first k indices by value (largest or
    smallest first; ties in index order, as PyTorch's), then ``inside`` for each rank ``r`` of them, where ``xi``
    and ``yi`` are the offsets of the element in ``x`` and of its place in ``values``' shape."""
    axis = node.axis % len(x.shape)
    size, k = x.shape[axis], values.shape[axis]
    index = [f"i{d}" for d in range(len(x.shape))]
    head, tail = loops([v for d, v in enumerate(index) if d != axis], [s for d, s in enumerate(x.shape) if d != axis])

    def element(at: str) -> str:
        return offset(x, [at if d == axis else v for d, v in enumerate(index)])

    # NaN is above every number, as PyTorch sorts it: first of the largest, last of the smallest
    before = "a > b || (a != a && b == b)" if node.largest else "a < b || (a == a && b != b)"
    body = f"std::vector<long long> order({size});\nfor (long long j = 0; j < {size}; ++j) order[j] = j;\n"
    body += (
        f"std::partial_sort(order.begin(), order.begin() + {k}, order.end(), [&](long long p, long long q) {{\n"
        f"const auto a = X[{element('p')}];\nconst auto b = X[{element('q')}];\n"
        f"return {before} || ((a == b || (a != a && b != b)) && p < q);\n}});\n"
    )
    at_rank = [v if d != axis else "r" for d, v in enumerate(index)]
    body += f"for (long long r = 0; r < {k}; ++r) {{\n"
    body += f"const long long xi = {element('order[r]')};\nconst long long yi = {offset(values, at_rank)};\n"
    return head + body + inside + "}\n" + tail


@pure_expansion("TopK")
class TopKExpansion(ONNXForward):
    # gap: DaCe has no implementation of the ONNX op TopK (torch.topk, torch.sort: a mixture of experts' routing)
    @staticmethod
    def forward(node, state, sdfg):
        written = [e.src_conn for e in state.out_edges(node)]
        x, result = in_desc_with_name(node, state, sdfg, "X"), out_desc_with_name(node, state, sdfg, written[0])
        inside = "".join(
            {"Values": "Values[yi] = X[xi];\n", "Indices": "Indices[yi] = order[r];\n"}[name] for name in written
        )
        return cpp_expansion(node, state, sdfg, _ordered(node, x, result, inside))


@autoregister_params(op="TopK", name="dcnb")
class TopKBackward(BackwardImplementation):
    # gap: DaCe's autodiff has no rule for TopK: each value's gradient goes to the element it was, found again from X
    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        x = forward_in(forward_node, context, "X")
        body = zero("X_grad", x)
        if "Values" in given_gradients:
            values = forward_out(forward_node, context, "Values")
            body += _ordered(forward_node, x, values, "X_grad[xi] += Values_grad[yi];\n")
        # (the indices' gradient, where autodiff gives one, is connected and unread)
        names = [f"{n}_grad" for n in given_gradients] + ["X", "X_grad"]
        return cpp_backward(forward_node, context, names, body)


default_backward("TopK")
