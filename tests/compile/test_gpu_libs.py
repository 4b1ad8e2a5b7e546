"""CUDA builds call cuBLAS and cuDNN for matrix products, convolutions and pooling (dcnb/_src/gpu_libs.py, the
GPU implementations in fixes/linalg.py, fixes/conv.py and fixes/pooling.py), built here without a GPU or the
libraries' headers.

Without them, the products ran as DaCe's loop kernels and convolutions and pooling as C++ loops in one-thread
kernels. The generated code is read: the calls are there, the loops are not, and nvcc compiled it. Whether the
results are right needs a GPU (tests/gpu/test_libraries_on_a_gpu.py, make gpu).
"""

import copy

import pytest
import torch
from torch import nn

import dcnb
from dcnb._src import actions
from tests.compile.test_blas import _Batched
from tests.cuda_sources import cuda_sources
from tests.models import TinyMLP

pytestmark = [pytest.mark.compile, pytest.mark.cuda]

ARCHES = ["90", "80"]


def _session(module: nn.Module, *inputs: torch.Tensor) -> dcnb.Session:
    session = dcnb.optimize(module, *inputs, baselines=(), time_budget=0.0)
    assert session.current.ok and session.current.check.ok, session.current.error
    return session


@pytest.mark.parametrize("arch", ARCHES)
def test_linear_layers_call_cublas(arch):
    session = _session(TinyMLP(), torch.randn(8, 16))
    (forward, forward_cuda), (backward, backward_cuda) = cuda_sources(session, arch)
    assert forward.count("dcnb_gpu::gemm(") == 2 and backward.count("dcnb_gpu::gemm(") == 4
    for host, cuda in ((forward, forward_cuda), (backward, backward_cuda)):
        # on the stream of the binary's kernels, one handle per loaded binary
        assert "__state->dcnb_cublas.on(__dace_current_stream)" in host
        assert "__state->dcnb_cublas.create()" in host and "__state->dcnb_cublas.destroy()" in host
        assert "gemm_init" not in cuda and "gemm_map" not in cuda  # none of DaCe's loops
        assert "cublas_v2.h" not in host + cuda and '#include "gpu_libs.h"' in host


def test_batched_products_call_cublas():
    torch.manual_seed(0)
    session = _session(_Batched(), torch.randn(2, 5, 4))
    for host, cuda in cuda_sources(session, "90"):
        assert "dcnb_gpu::gemm_batched(" in host
        assert "_BatchedMatMult_" not in cuda and "gemm_map" not in cuda


class _Convolutions(nn.Module):
    """A convolution of one group (stride 2, padding, bias), a depthwise one, and a 1-d one with dilation."""

    def __init__(self):
        super().__init__()
        self.full = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.wide = nn.Conv1d(8, 4, 3, padding=2, dilation=2, bias=False)

    def forward(self, x):
        y = torch.tanh(self.depthwise(self.full(x)))
        return self.wide(y.flatten(2))


class _SqueezeExcite(nn.Module):
    """EfficientNet's squeeze-excitation: 1x1 convolutions with a bias over one position per channel."""

    def __init__(self):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(8, 4, 1), nn.Conv2d(4, 8, 1)

    def forward(self, x):
        scale = torch.sigmoid(self.expand(nn.functional.silu(self.reduce(x.mean((2, 3), keepdim=True)))))
        return x * scale


@pytest.mark.parametrize("arch", ARCHES)
def test_convolutions_call_cudnn(arch):
    session = _session(_Convolutions(), torch.randn(2, 3, 16, 16))
    (forward, forward_cuda), (backward, backward_cuda) = cuda_sources(session, arch)
    assert forward.count("dcnb_gpu::Convolution ") == 3  # a state field each
    assert forward.count(".forward<float>(__state->dcnb_cudnn, __dace_current_stream") == 3
    # every gradient, a bias's too: the loops ran them as one-thread kernels (cuDNN's own bias gradient answered
    # BAD_PARAM on an H100; cuBLAS sums it, on the same stream)
    calls = ".backward<float>(__state->dcnb_cudnn, __state->dcnb_cublas, __dace_current_stream"
    assert backward.count(calls) == 3
    # the groups, and the directions each node runs (its algorithms chosen when the binary is loaded)
    assert ', 1, "dw")' in backward and ', 8, "dwb")' in backward and ', 1, "dwb")' in backward
    assert "__state->dcnb_cublas.create()" in backward
    assert "__state->dcnb_cudnn.create()" in forward
    # none of the C++ loops
    assert "im2col" not in forward + forward_cuda and "acc +=" not in forward_cuda + backward_cuda
    assert "B_grad[oc] +=" not in backward_cuda
    for host, cuda in ((forward, forward_cuda), (backward, backward_cuda)):
        assert "cudnn.h" not in host + cuda


def test_a_bias_gradient_of_one_position_per_channel_is_summed_by_cublas():
    session = _session(_SqueezeExcite(), torch.randn(2, 8, 5, 5))
    _, (backward, backward_cuda) = cuda_sources(session, "90")
    assert backward.count(".backward<float>(__state->dcnb_cudnn, __state->dcnb_cublas") == 2
    assert backward.count('"dwb")') == 2 and "B_grad[oc] +=" not in backward_cuda


class _Pools(nn.Module):
    def forward(self, x):
        a = nn.functional.max_pool2d(x, 2)
        b = nn.functional.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False)
        c = nn.functional.avg_pool2d(x, 3, stride=2, padding=1)
        d = nn.functional.max_pool2d(x, 3, stride=2, ceil_mode=True)  # a clipped last window: the loops
        return a.sum() + b.sum() + c.sum() + d.sum()


def test_pooling_calls_cudnn_where_it_computes_what_pytorch_does():
    session = _session(_Pools(), torch.randn(2, 3, 8, 8))
    (forward, forward_cuda), (backward, backward_cuda) = cuda_sources(session, "90")
    for host in (forward, backward):
        assert "CUDNN_POOLING_MAX_DETERMINISTIC" in host
        assert "CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING" in host
        assert "CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING" in host
    assert forward.count("dcnb_gpu::Pooling ") == 3 and backward.count("dcnb_gpu::Pooling ") == 3
    # ceil_mode's max pooling stays the C++ loops, forward and backward
    assert "best = -1" in forward_cuda and "best = -1" in backward_cuda


def test_auto_optimize_for_a_gpu_keeps_to_the_libraries_a_build_reaches():
    # on an H100, DaCe's auto_optimize chose its own cuBLAS (whose header clashes with gpu_libs.h) and cuTENSOR (not
    # installed) for the models' products: no step after it compiled
    session = _session(TinyMLP(), torch.randn(64, 16))
    sdfgs = [copy.deepcopy(s) for s in (session._states[-1].sdfgs.forward, session._states[-1].sdfgs.backward)]
    for sdfg in sdfgs:
        actions.get("auto_optimize").run(sdfg, None, {}, "cuda")
    (forward, _), (backward, _) = cuda_sources(session, "90", sdfgs)
    assert "dcnb_gpu::gemm(" in forward and "dcnb_gpu::gemm(" in backward
