"""The CUDA path on a GPU (``make gpu``; deselected without --gpu, skipped where PyTorch sees no GPU): the C++ call
path on CUDA tensors against eager on outputs and gradients, on PyTorch's current stream, CUDA graphs replayed to
the same results, and the model zoo on CUDA. What can be checked without a GPU is in
tests/compile/test_native_cuda.py and tests/compile/test_cuda_build.py."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import dcnb
from dcnb._src import native
from dcnb._src.module import Runner
from tests.models import Mish, TinyMLP
from tests.zoo import CASES, ZOO

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@pytest.fixture(autouse=True)
def _cpp_path_on_cuda(monkeypatch):
    monkeypatch.setenv("DCNB_NATIVE_CUDA", "1")  # off by default until these tests have passed on a GPU


def _session(module: nn.Module, *inputs: torch.Tensor) -> dcnb.Session:
    return dcnb.optimize(module, *inputs, baselines=(), time_budget=0.0, device="cuda")


def _native(session: dcnb.Session) -> Runner:
    """The session's runner, which must call its binaries from C++."""
    runner = session._states[-1].runner
    assert runner._plan is not None, (
        "CUDA calls went through Python: the binaries have no __dcnb_call_ entry (build.py adds it to CPU builds) "
        "or native.cpp did not build"
    )
    return runner


def _assert_matches_eager(session: dcnb.Session, reference: nn.Module, x: torch.Tensor) -> None:
    """Outputs and the gradients of the input and of every parameter, dcnb's against eager's."""
    ours = x.detach().clone().requires_grad_()
    theirs = x.detach().clone().requires_grad_()
    y = session.module(ours)
    want = reference(theirs)
    upstream = torch.randn_like(want)
    y.backward(upstream)
    want.backward(upstream)
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-5)
    for (name, got), expected in zip(session.module.module.named_parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-4, atol=1e-5, msg=f"grad {name} differs")


@pytest.mark.parametrize("make,shape", [(Mish, (8, 32, 64, 64)), (TinyMLP, (64, 16))], ids=["mish", "mlp"])
def test_the_cpp_path_on_cuda_matches_eager(make, shape):
    torch.manual_seed(0)
    module = make().cuda()
    reference = copy.deepcopy(module)
    x = torch.randn(*shape, device="cuda")
    session = _session(module, x)
    assert session.current.ok, session.current.error
    _native(session)
    _assert_matches_eager(session, reference, x)


def test_a_call_on_a_side_stream_waits_for_its_inputs_and_its_users_wait_for_it():
    # PyTorch's side streams do not wait for the legacy default stream: without the call's ordering the kernels
    # would read an input still being written, and the next op an output not yet written
    torch.manual_seed(0)
    shape = (8, 32, 224, 224)  # large enough that an unordered read would see unwritten memory
    session = _session(Mish().cuda(), torch.randn(*shape, device="cuda"))
    _native(session)
    x = torch.randn(*shape, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        y = session.module(x * 3.0 - 1.0) * 2.0
    torch.cuda.synchronize()
    torch.testing.assert_close(y, Mish()(x * 3.0 - 1.0) * 2.0, rtol=1e-4, atol=1e-5)


def test_cuda_graphs_replay_to_the_same_results(monkeypatch):
    monkeypatch.setenv("DCNB_CUDA_GRAPHS", "1")
    torch.manual_seed(0)
    x = torch.randn(8, 32, 64, 64, device="cuda")
    session = _session(Mish().cuda(), x)
    runner = _native(session)
    for binary in (runner.forward_binary, runner.backward_binary):
        assert native.cuda_launch(binary)[1], (
            "no CUDA graph can be captured: the CUDA builds launch on the legacy default stream or synchronize the "
            "host at their end (build.py's max_concurrent_streams, docs/gpu.md)"
        )
    before = [captured for captured, _ in runner._native.graphs(runner._plan)]
    calls = 5
    for _ in range(calls):  # a loop frees each call's tensors: the caching allocator hands out the same addresses
        _assert_matches_eager(session, Mish(), x)
    graphs = runner._native.graphs(runner._plan)
    assert [error for _, error in graphs] == ["", ""]
    # the forward's and the backward's graphs captured, and replayed: fewer captures in the loop than calls
    assert all(captured >= 1 for captured, _ in graphs), graphs
    assert all(captured - b < calls for (captured, _), b in zip(graphs, before)), (before, graphs)


@pytest.mark.parametrize(
    "name,training",
    [
        pytest.param(case.name, training, id=f"{case.name}-{'train' if training else 'eval'}")
        for case in ZOO
        for training in case.modes
    ],
)
def test_the_zoo_on_cuda(name, training):
    module, inputs = CASES[name].build()
    session = dcnb.optimize(module, *inputs, training=training, baselines=(), time_budget=0.0, device="cuda")
    step = session.current
    assert step.ok and step.check.ok, step.error
