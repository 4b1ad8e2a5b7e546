"""NaN, infinities and values whose squares overflow (1e30) through the op catalog (tests/ops.py): the compiled
module's outputs and gradients are PyTorch eager's, NaN where eager's is NaN and the same infinity where it is
infinite (verify.compare).

Each op is built once at its catalog inputs (the session checks those), then called with its floating-point inputs
holding one special value in two places (a different two in each input). Where eager's own result is an accident
of its kernel (EAGER_OWN) that result is left unchecked; what dcnb still gets wrong is listed (GAPS). The default
suite builds a representative set (DEFAULT: the ops of the fixes that make dcnb give what eager gives);
``pytest --ops`` (``make ops``) builds every op of the catalog.
"""

from __future__ import annotations

import math

import pytest
import torch

import dcnb
from dcnb._src import structure, verify
from tests.compile.test_ops import NOT_EXPORTED
from tests.ops import FAMILIES, OPS

pytestmark = pytest.mark.compile

SPECIAL = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "1e30": 1e30, "-1e30": -1e30}

#: one op of each fix (dcnb/_src/fixes, dcnb/_src/export_rules.py) that makes dcnb give what eager gives here: Relu,
#: LeakyRelu, PRelu, the ELU family, Sigmoid's gradient, Max and Min, the maxima and minima of a reduction and their
#: gradient, TopK's order, logsumexp of an infinity, the gradients of the L2 norm and of a product, and the losses
#: and LogSigmoid as dcnb exports them
DEFAULT = {
    "relu", "leaky_relu", "prelu", "selu", "sigmoid", "maximum", "max_dim", "min_all", "topk", "logsumexp",
    "norm_all", "prod_zeros", "logsigmoid", "smooth_l1", "bce_with_logits", "kl_div",
}

#: where eager's own result is no propagation dcnb can follow: op -> (the special values, the tensors left unchecked
#: with them: "output", "grad" for every gradient). Everything else of the op is checked.
EAGER_OWN: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # PyTorch's vectorized erf gives gelu(inf) = NaN, its scalar loop (a tensor of one element) inf, as dcnb does
    "gelu": (("inf",), ("output",)),
    # PyTorch's LayerNorm sums a row's moments in vector lanes (Welford): a square that overflows gives NaN in the
    # first lane of a vector and 0 in the others (as dcnb everywhere: its variance is inf)
    "layer_norm": (("1e30", "-1e30"), ("output", "grad")),
    "layer_norm_2d": (("1e30", "-1e30"), ("output", "grad")),
    # ONNX's ReduceMax stands for amax, max(dim) and max() alike; dcnb's gradient is 0 for the elements that are not
    # the maximum, as max()'s and max(dim)'s, where amax's is its gradient times 0 (NaN for a NaN or an infinity)
    "amax": (("nan", "inf", "-inf"), ("grad",)),
    "amax_keepdim": (("nan", "inf", "-inf"), ("grad",)),
    "amax_ties": (("nan",), ("grad",)),
    # eager's source index of a linear interpolation carries float rounding: a weight of 1.5e-8 where dcnb's is 0,
    # which an infinity beside it shows (inf where dcnb's 0 * inf is NaN)
    "interpolate_linear": (("inf", "-inf"), ("output",)),
    # eager's weight gradient of a transposed convolution multiplies an input's NaN or inf by the 0 of an output
    # position cropped off by the padding on one path (grouped) and leaves it out on the other (oneDNN): dcnb's
    # loops (grouped) leave it out, its GEMM multiplies
    "conv_transpose2d": (("nan", "inf", "-inf"), ("grad",)),
    "conv_transpose2d_groups": (("nan", "inf", "-inf"), ("grad",)),
    # eager's CPU flash attention gives 0 for a query row holding a NaN, its math backend NaN, as dcnb does
    "sdpa_causal": (tuple(SPECIAL), ("output", "grad")),
}

#: what dcnb still gets wrong here, by op: the test fails there (xfail, strict: a fix shows as XPASS)
GAPS = {
    # fixing it would change the form Mish's simplify_algebra reads (docs/actions.md)
    "softplus_beta": "DaCe's Softplus, log(1 + exp(x)), is inf beyond x = 88 (eager's: x), its gradient NaN",
    "mish": "DaCe's Softplus, log(1 + exp(x)), is inf beyond x = 88 (eager's: x), its gradient NaN",
    "einsum_diagonal": "the einsum export takes a diagonal as a product with eye: an off-diagonal NaN spreads",
    "sdpa_mask": "PyTorch's export of attention with a boolean mask zeroes NaN weights (rows masked entirely)",
}


def _params():
    params = []
    for family in FAMILIES.values():
        for name in (op.name for op in family if op.name not in NOT_EXPORTED):
            marks = [] if name in DEFAULT else [pytest.mark.ops]
            if name in GAPS:
                marks.append(pytest.mark.xfail(reason=GAPS[name], strict=True))
            params.append(pytest.param(name, id=name, marks=marks))
    return params


def _with(inputs: tuple[torch.Tensor, ...], value: float) -> list[torch.Tensor]:
    """The inputs with ``value`` in two places of each floating-point one, other places in each."""
    changed = []
    for k, t in enumerate(inputs):
        if t.is_floating_point():
            t = t.clone()
            flat = t.view(-1)
            for place in (k, flat.numel() // 2 + 1 + k):
                flat[place % flat.numel()] = value
        changed.append(t)
    return changed


def _run(module: torch.nn.Module, of: torch.nn.Module, inputs: list[torch.Tensor]) -> verify.Run:
    """Outputs, and the gradients of the inputs and of ``of``'s parameters for fixed upstream gradients."""
    with torch.no_grad():
        outputs = structure.leaves(module(*inputs))
    names = [f"input {i}" for i in range(len(inputs))]
    return verify.run(lambda *xs: structure.leaves(module(*xs)), of, inputs, verify.grad_outputs(outputs), names)


@pytest.mark.parametrize("name", _params())
def test_special_values_come_out_as_in_pytorch(name):
    module, inputs = OPS[name].build()
    if not any(t.is_floating_point() for t in inputs):
        pytest.skip("no floating-point input")
    session = dcnb.optimize(module, *inputs, baselines=(), time_budget=0)
    assert session.current.ok, session.current.error
    compiled = session.module
    module.eval()  # as the session compiled it
    wrong = {}
    for special, value in SPECIAL.items():
        xs = _with(inputs, value)
        want, got = _run(module, module, xs), _run(compiled, module, xs)
        specials, unchecked = EAGER_OWN.get(name, ((), ()))
        kept = {
            label: t
            for label, t in want.tensors.items()
            if special not in specials or label.split()[0] not in unchecked
        }
        check = verify.compare(got, verify.Run(kept))
        if not check.ok:
            wrong[special] = {label: error for label, error in check.errors.items() if error}
    assert not wrong, wrong
