"""The op catalog (tests/ops.py) through dcnb: each op builds and matches PyTorch eager forward and backward, within
the zoo's tolerance, or is refused with a message naming the op and where it comes from.

The default suite builds a representative set (DEFAULT: one op of each family, touching the fixes of each family
in dcnb/_src/fixes/); ``pytest --ops`` (``make ops``) builds every op.
"""

from __future__ import annotations

import copy

import pytest
import torch

import dcnb
from tests.ops import FAMILIES, OPS

pytestmark = pytest.mark.compile

#: one op of each family, each through a fix of its own (its test fails without it)
DEFAULT = {
    "elu", "hardtanh_beside_clamp", "softmax_channels", "logical_and_or", "pow", "outer", "addmm_scaled_row_bias",
    "group_norm", "conv1d",
    "pad_reflect", "roll", "slice_assigned", "max_dim", "topk", "mse", "lstm",
    "einsum_diagonal", "einsum_batch_in_the_middle", "matmul_broadcast_batch_of_one",
}
#: ops PyTorch's ONNX exporter cannot export with these arguments: refused before DaCe sees them, with the reason
NOT_EXPORTED = {
    "threshold": "non-zero threshold",
}


def _params():
    return [
        pytest.param(name, id=name, marks=() if name in DEFAULT else pytest.mark.ops)
        for family in FAMILIES.values()
        for name in (op.name for op in family)
    ]


@pytest.mark.parametrize("name", _params())
def test_op_matches_pytorch(name):
    module, inputs = OPS[name].build()
    if name in NOT_EXPORTED:
        with pytest.raises(dcnb.DcnbError, match=NOT_EXPORTED[name]):
            dcnb.optimize(module, *inputs, baselines=(), time_budget=0.01)
        return
    session = dcnb.optimize(module, *inputs, baselines=(), time_budget=0.01)
    step = session.current
    assert step.ok and step.check.ok, step.error
    labels = set(step.check.errors)
    params = {f"grad {n}" for n, p in module.named_parameters()}
    assert params <= labels, labels
    assert len({label for label in labels if label.startswith("grad ")} - params) == _inputs_with_gradients(module, inputs)


def _inputs_with_gradients(module, inputs) -> int:
    """How many inputs PyTorch gives a gradient (an input that only a comparison reads gets none)."""
    leaves = [t.detach().requires_grad_() if t.is_floating_point() else t for t in inputs]
    out = copy.deepcopy(module)(*leaves)
    outputs = [out] if isinstance(out, torch.Tensor) else list(out)
    torch.autograd.backward([o for o in outputs if o.requires_grad], [torch.ones_like(o) for o in outputs if o.requires_grad])
    return sum(t.is_floating_point() and t.grad is not None for t in leaves)
