"""cuBLAS and cuDNN on a GPU (``make gpu``; deselected without --gpu, skipped where PyTorch sees no GPU): CUDA
builds of products, convolutions and pooling against eager, outputs and gradients (every session step checks
them). What can be checked without a GPU is in tests/compile/test_gpu_libs.py."""

from __future__ import annotations

import pytest
import torch

import dcnb
from tests.compile.test_blas import _Batched
from tests.compile.test_gpu_libs import _Convolutions, _Pools, _SqueezeExcite
from tests.models import TinyMLP

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

CASES = {
    "mlp": lambda: (TinyMLP(), torch.randn(8, 16)),
    "batched": lambda: (_Batched(), torch.randn(2, 5, 4)),
    "convolutions": lambda: (_Convolutions(), torch.randn(2, 3, 16, 16)),
    # a bias's gradient summed by cuBLAS over the positions and the batch, over either alone, or copied
    "convolutions_of_one_item": lambda: (_Convolutions(), torch.randn(1, 3, 16, 16)),
    "squeeze_excite": lambda: (_SqueezeExcite(), torch.randn(2, 8, 5, 5)),
    "squeeze_excite_of_one_item": lambda: (_SqueezeExcite(), torch.randn(1, 8, 5, 5)),
    "pools": lambda: (_Pools(), torch.randn(2, 3, 8, 8)),
    # ties in every window: max pooling's gradient goes to one element of each, as PyTorch's first maximum
    "tied_pools": lambda: (_Pools(), torch.randint(0, 2, (2, 3, 8, 8)).float()),
}


@pytest.mark.parametrize("name", CASES)
def test_library_calls_match_eager(name):
    torch.manual_seed(0)
    module, x = CASES[name]()
    step = dcnb.optimize(module, x, baselines=(), time_budget=0.0, device="cuda").current
    assert step.ok and step.check.ok, (step.error, step.check)
