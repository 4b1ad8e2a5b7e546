"""The C++ call path's CUDA branch on a machine without a GPU: native.cpp builds and links with a CPU-only PyTorch,
no CUDA library and no nvcc, its CUDA entry points are there, a CPU call through the same plan is unchanged, and
the CUDA binaries DaCe builds here are read as native.cpp will call them. Running them needs a GPU: tests/gpu
(``make gpu``)."""

import math
import shutil

import pytest
import torch
from dace.config import Config, temporary_config

import dcnb
from dcnb._src import build, native
from tests.compile.test_blas import _Batched
from tests.models import Mish

pytestmark = pytest.mark.compile


def test_the_extension_has_its_cuda_branch_without_cuda():
    extension = native.extension()
    assert extension is not None, "the C++ call path did not build"
    reason = extension.cuda_driver()
    # the driver is opened at run time, not linked: here dlopen's own reason, where a driver is installed none
    assert reason == "" or "libcuda.so.1" in reason, reason


def test_a_cpu_plan_takes_the_cuda_arguments_and_calls_as_before(monkeypatch):
    monkeypatch.setenv("DCNB_NATIVE", "1")
    torch.manual_seed(0)
    x = torch.rand(2, 4, 16, 16)
    session = dcnb.optimize(Mish(), x, baselines=(), time_budget=0.0)
    runner = session._states[-1].runner
    assert runner._plan is not None, "the CPU call did not go through native.cpp"
    xr = x.clone().requires_grad_()
    y = session.module(xr)
    upstream = torch.rand_like(y)
    y.backward(upstream)
    expected = x.clone().requires_grad_()
    want = Mish()(expected)
    want.backward(upstream)
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(xr.grad, expected.grad)
    # neither the forward nor the backward has CUDA graphs on the CPU
    assert runner._native.graphs(runner._plan) == [(0, ""), (0, "")]


@pytest.mark.cuda
def test_cuda_builds_launch_on_the_stream_they_are_given_and_can_be_captured():
    # build.py builds for one stream with no host wait in a call: native.cpp hands each call PyTorch's current
    # stream through __dace_gpu_set_all_streams, and may capture the call into a CUDA graph
    session = dcnb.optimize(Mish(), torch.rand(2, 3, 8, 8), baselines=(), time_budget=0.0)
    assert session.apply("tasklet_fusion").ok
    assert all(set_streams != 0 and capturable for set_streams, capturable in _cuda_launches(session))


@pytest.mark.cuda
def test_a_cuda_build_that_waits_or_copies_host_memory_in_a_call_is_not_captured():
    # the sum the forward keeps for the backward (a scalar, which autodiff forwards in a one-element array) is read
    # back on the host in the backward, with a stream synchronization: that binary is called as it is, never captured
    session = dcnb.optimize(_OverItsSum(), torch.randn(2, 5, 4), baselines=(), time_budget=0.0)
    (_, forward), (streams, backward) = _cuda_launches(session)
    assert forward and streams != 0 and not backward


@pytest.mark.cuda
def test_the_constants_a_gelu_keeps_for_its_backward_leave_both_cuda_builds_captured():
    # GELU written out: the forward copied its constants (0.5, 1, sqrt(2)) from the host into arrays kept for the
    # backward, which read them back on the host with a stream synchronization; neither binary was captured. The
    # backward now takes them as the forward does (after_autodiff.constants_passed_again)
    session = dcnb.optimize(_ErfGelu(), torch.randn(2, 5, 4), baselines=(), time_budget=0.0)
    assert all(set_streams != 0 and capturable for set_streams, capturable in _cuda_launches(session))


@pytest.mark.cuda
def test_a_batched_product_s_cuda_build_is_captured():
    # its transpose's expansion ended with a stream synchronization, and its backward allocated an accumulator per
    # call: neither now
    session = dcnb.optimize(_Batched(), torch.randn(2, 5, 4), baselines=(), time_budget=0.0)
    assert all(set_streams != 0 and capturable for set_streams, capturable in _cuda_launches(session))


class _OverItsSum(torch.nn.Module):
    def forward(self, x):
        return x / x.sum()


class _ErfGelu(torch.nn.Module):
    def forward(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _cuda_launches(session: dcnb.Session) -> list[tuple[int, bool]]:
    """How native.cpp would call the CUDA builds (for an H100) of the session's forward and backward."""
    assert shutil.which("nvcc"), "nvcc belongs to the build environment"
    sdfgs = session._states[-1].sdfgs
    with temporary_config():
        Config.set("compiler", "cuda", "cuda_arch", value="90")
        built = build.build([sdfgs.forward, sdfgs.backward], "cuda")
    return [native.cuda_launch(binary) for binary in built.binaries]
