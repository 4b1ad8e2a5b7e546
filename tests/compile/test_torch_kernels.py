"""Convolutions on the CPU call PyTorch's own kernels (dcnb/_src/torch_kernels.py, fixes/conv.py), forward and
backward, where the bridge builds; depthwise ones keep dcnb's loops, 1x1 ones its matrix product where ATen has
no AVX-512 kernels, and ``DCNB_CONV=loops`` keeps them all.

Without the bridge a convolution of one group is im2col and a BLAS product, a grouped one C++ loops: 4.3x and 7.7x
eager's time forward+backward at 8x64x56x56. Every step checks outputs and gradients against PyTorch; the tests
check which code the binaries call.
"""

import pathlib
import subprocess
import sys

import pytest
import torch
from torch import nn

import dcnb
from dcnb._src import blas, torch_kernels

pytestmark = pytest.mark.compile


def _sources(session) -> str:
    runner = session._states[-1].runner
    found = []
    for binary in (runner.forward_binary, runner.backward_binary):
        library = pathlib.Path(binary._lib._library_filename)
        found += [p.read_text() for p in (library.parents[1] / "src" / "cpu").glob("*.cpp")]
    return "\n".join(found)


class _Block(nn.Module):
    """A strided convolution with a bias, a grouped one, a depthwise one, BatchNorm, ReLU and a 1x1 one."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=2, bias=False)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.norm = nn.BatchNorm2d(8)
        self.pointwise = nn.Conv2d(8, 4, 1, bias=False)

    def forward(self, x):
        return self.pointwise(self.depthwise(torch.relu(self.norm(self.grouped(self.stem(x))))))


def _session(training: bool, **options):
    torch.manual_seed(0)
    module = _Block().train(training)
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    return dcnb.optimize(module, x, training=training, baselines=(), time_budget=0.0, **options)


@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
def test_convolutions_call_pytorch_s_kernels_and_depthwise_and_1x1_ones_where_measured_faster(training):
    assert torch_kernels.library() is not None, "the bridge to PyTorch's convolutions did not build"
    session = _session(training)
    step = session.current
    assert step.ok and step.check.ok, step.error
    weights = {f"grad {name}.weight" for name in ("stem", "grouped", "depthwise", "pointwise")}
    assert {"grad x", "grad stem.bias", *weights} <= set(step.check.errors)
    code = _sources(session)
    # the stem's and the grouped convolution's forward and backward, and the 1x1 one's where ATen has its AVX-512
    # kernels (torch_kernels.for_pointwise), else a BLAS product; the depthwise one's (3x3, stride 1, 8x8) there
    # too (torch_kernels.for_depthwise), else loops
    pointwise = torch_kernels.for_pointwise()
    depthwise = torch_kernels.for_depthwise((3, 3), (1, 1), (8, 8))
    calls = 2 + pointwise + depthwise
    assert code.count("dcnb_torch_conv(") == calls and code.count("dcnb_torch_conv_backward(") == calls
    assert ("cblas_sgemm" in code) != pointwise


def test_depthwise_convolutions_call_pytorch_s_kernels_for_the_windows_they_were_measured_faster_in():
    fast = torch_kernels.avx512()
    assert torch_kernels.for_depthwise((3, 3), (1, 1), (56, 56)) == fast
    assert torch_kernels.for_depthwise((5, 5), (1, 1), (28, 28)) == fast  # channels-last: 2x the loops' speed
    assert torch_kernels.for_depthwise((7, 7), (1, 1), (14, 14)) == fast
    assert not torch_kernels.for_depthwise((3, 3), (2, 2), (112, 112))  # strided: the loops, 3.7x faster
    assert not torch_kernels.for_depthwise((7, 7), (1, 1), (7, 7))  # a window as wide as the image: the loops, 3x
    assert not torch_kernels.for_depthwise((3,), (1,), (64,))  # 1-D: not measured


@pytest.mark.skipif(not torch_kernels.for_depthwise((3, 3), (1, 1), (16, 16)), reason="the loops take depthwise ones")
def test_a_depthwise_backward_that_does_not_read_its_input_takes_a_placeholder_in_its_layout():
    # a frozen weight: only the input's gradient, which does not read the input; its placeholder is channels-last
    torch.manual_seed(0)
    module = nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False).requires_grad_(False)
    session = dcnb.optimize(module, torch.randn(2, 4, 16, 16, requires_grad=True), baselines=(), time_budget=0.0)
    assert session.current.ok and session.current.check.ok, session.current.error
    assert set(session.current.check.errors) == {"output", "grad input"}
    assert "dcnb_torch_conv_backward(" in _sources(session)


def test_dcnb_conv_loops_keeps_dcnb_s_own_convolutions(monkeypatch):
    monkeypatch.setenv("DCNB_CONV", "loops")
    session = _session(training=True)
    assert session.current.ok and session.current.check.ok, session.current.error
    assert "dcnb_torch_conv" not in _sources(session)


def test_dcnb_conv_names_its_choices(monkeypatch):
    monkeypatch.setenv("DCNB_CONV", "onednn")
    with pytest.raises(ValueError, match="DCNB_CONV must be one of torch, loops"):
        torch_kernels.wanted()


@pytest.mark.deep
def test_the_bridge_is_built_for_models_calling_it_only_for_a_convolution_while_exporting(fresh_cache, monkeypatch):
    # its build waited for the bridge (6-16 s, a transformer's first step on a machine) that none of its code calls:
    # neither convolutions nor matrix products (which call it where oneDNN's products are chosen: blas.py)
    torch.manual_seed(0)
    x = torch.randn(2, 8, requires_grad=True)
    session = dcnb.optimize(nn.Sequential(nn.GELU(), nn.Tanh()), x, baselines=(), time_budget=0.0)
    assert session.current.ok and session.current.check.ok, session.current.error
    assert not (fresh_cache / "torch_kernels").exists()
    products = dcnb.optimize(nn.Sequential(nn.Linear(8, 8), nn.GELU()), x, baselines=(), time_budget=0.0)
    assert products.current.ok and products.current.check.ok, products.current.error
    folder = fresh_cache.absolute() / "torch_kernels" / torch_kernels.digest()
    assert (folder / "libdcnb_torch_kernels.so").is_file() == (blas.chosen().name == "onednn")
    if folder.exists():  # (where oneDNN's products are chosen) a cache where the session below finds none
        monkeypatch.setenv("DCNB_CACHE", str(fresh_cache / "convolutions"))
        folder = fresh_cache.absolute() / "convolutions" / "torch_kernels" / torch_kernels.digest()
    # a session whose module has a convolution: its first build waited 10-14 s for the bridge while preparing the
    # backward's compile, the other core idle; it is built while the session exports
    seen = []

    def progress(message: str) -> None:
        if message == "exporting to ONNX":
            ahead = torch_kernels._ahead.get(folder)
            seen.append(ahead is not None and ahead.process.poll() is None)

    session = _session(training=True, progress=progress)
    assert seen == [True]  # the compiler was running
    assert session.current.ok and session.current.check.ok, session.current.error
    assert (folder / "libdcnb_torch_kernels.so").is_file() and folder not in torch_kernels._ahead
    assert [p.name for p in folder.iterdir()] == ["libdcnb_torch_kernels.so"]  # no partial file left


@pytest.mark.deep
def test_a_bridge_build_begun_and_never_taken_is_finished_before_its_process_exits(fresh_cache):
    # a session that stopped before its first build: the next process finds the library built
    started = subprocess.run(
        [sys.executable, "-c", "from dcnb._src import torch_kernels; torch_kernels.start()"], capture_output=True
    )
    assert started.returncode == 0, started.stderr
    folder = fresh_cache.absolute() / "torch_kernels" / torch_kernels.digest()
    assert [p.name for p in folder.iterdir()] == ["libdcnb_torch_kernels.so"]
