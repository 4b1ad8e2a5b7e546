"""The C++ call path (native.cpp) against the Python one, on real builds: the same outputs, gradients and buffer
updates, and the cases the Python path handled by construction (a graph outliving its module, odd inputs)."""

import copy
import gc

import pytest
import torch
from torch import nn

import dcnb
from tests.models import Mish

pytestmark = pytest.mark.compile


class TwoHeads(nn.Module):
    """Parameters, running statistics a training-mode call updates, and two outputs (one left out of a loss)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        h = self.bn(self.fc(x))
        return torch.tanh(h), h * 2


def _session(module, x, monkeypatch, native: str):
    monkeypatch.setenv("DCNB_NATIVE", native)
    session = dcnb.optimize(module, x, baselines=(), time_budget=0.0, training=True)
    assert (session._states[-1].runner._plan is not None) is (native == "1")
    return session


def test_the_cpp_and_python_calls_agree_on_outputs_gradients_and_buffers(monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(4, 8, 5, 6)
    modules = {path: TwoHeads() for path in ("1", "0")}
    modules["0"].load_state_dict(modules["1"].state_dict())
    sessions = {path: _session(m, x, monkeypatch, path) for path, m in modules.items()}
    upstream = torch.randn(4, 8, 5, 6)
    results = {}
    for path, session in sessions.items():
        xr = x.clone().requires_grad_()
        first, _ = session.module(xr)  # the second output gets no gradient: zeros go in its place
        first.backward(upstream)
        module = modules[path]
        results[path] = [first, xr.grad, *(p.grad for p in module.parameters()), *module.buffers()]
    assert modules["1"].bn.num_batches_tracked.item() == modules["0"].bn.num_batches_tracked.item() > 0
    for native, python in zip(results["1"], results["0"]):
        torch.testing.assert_close(native, python, rtol=1e-5, atol=1e-6)


def test_a_graph_outlives_its_module_and_session():
    torch.manual_seed(0)
    x = torch.rand(2, 4, 16, 16, requires_grad=True)
    y = dcnb.optimize(Mish(), x.detach(), baselines=(), time_budget=0.0).module(x)
    gc.collect()  # the session and its module are gone: the graph holds the binaries
    upstream = torch.rand_like(y)
    y.backward(upstream)
    expected = torch.autograd.grad(Mish()(x), x, upstream)[0]
    torch.testing.assert_close(x.grad, expected)


def test_unaligned_and_strided_inputs_are_copied_for_the_binaries():
    torch.manual_seed(0)
    shape = (2, 4, 16, 16)
    session = dcnb.optimize(Mish(), torch.rand(*shape), baselines=(), time_budget=0.0)
    base = torch.rand(1 + 2 * 4 * 16 * 16, requires_grad=True)
    unaligned = base[1:].view(shape)  # starts 4 bytes past a 64-byte boundary
    strided = copy.deepcopy(base.detach())[1:].view(2, 4, 16, 16).transpose(2, 3).requires_grad_()
    for x in (unaligned, strided):
        assert x.data_ptr() % 64 or not x.is_contiguous()
        upstream = torch.rand(shape)
        y = session.module(x)
        got = torch.autograd.grad(y, x, upstream)[0]
        want_y = Mish()(x)
        torch.testing.assert_close(y, want_y)
        torch.testing.assert_close(got, torch.autograd.grad(want_y, x, upstream)[0])


_OUTLIVES = """
import torch, dcnb
from dcnb._src import native
native.extension()  # built or loaded before the session, so that its module is called from C++
session = dcnb.optimize(torch.nn.Embedding(20, 8), torch.randint(0, 20, (2, 5)), baselines=(), time_budget=0.01)
kept = session.module(torch.randint(0, 20, (2, 5)))  # its graph lives until the interpreter has gone
print("native" if native.extension() is not None and native.calls() else "python")
"""


def test_a_graph_kept_until_the_interpreter_exits_does_not_abort_it(tmp_path):
    # the call's plan dropped its Python reference without the GIL once Python had finalized: pybind11 aborted
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _OUTLIVES], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "native", "the C++ path was not taken: nothing was tested"


class Residual(nn.Module):
    """A residual whose gradient accumulates (a zeroed scratch array in the backward) and a bias gradient."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


@pytest.mark.parametrize("native", ["1", "0"])
def test_threads_calling_one_module_get_their_own_results(monkeypatch, native):
    # a CPU binary allocates its scratch arrays once (passes/lifetimes.py): calls from several threads take turns
    import threading

    monkeypatch.setenv("DCNB_NATIVE", native)
    torch.manual_seed(0)
    module = Residual()
    session = dcnb.optimize(module, torch.randn(16, 32, 64), baselines=(), time_budget=0.0)
    forward = session.forward_sdfg
    assert any(d.transient and d.lifetime.name == "Persistent" for d in forward.arrays.values())
    inputs = [torch.randn(16, 32, 64) for _ in range(4)]
    wanted = []
    for x in inputs:
        x = x.clone().requires_grad_()
        module(x).square().sum().backward()
        wanted.append(x.grad)
    got = [[] for _ in inputs]

    def work(i):
        for _ in range(20):
            x = inputs[i].clone().requires_grad_()
            session.module(x).square().sum().backward()
            got[i].append(x.grad)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for want, grads in zip(wanted, got):
        assert len(grads) == 20
        for grad in grads:
            torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-4)
