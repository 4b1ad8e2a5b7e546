"""The CUDA path on a machine without a GPU: DaCe's CUDA code generation and nvcc build dcnb's SDFGs.

Running them needs a GPU (checked where one is lent: benchmarks/NOTES.md); what can break without one is caught
here, from the generated code.
"""

import pathlib
import re
import shutil

import pytest
import torch
from dace.config import Config, temporary_config
from torch import nn

import dcnb
from dcnb._src import build
from models import Mish
from zoo import CASES

pytestmark = pytest.mark.compile


def _cuda_sources(session: dcnb.Session) -> list[tuple[str, str]]:
    """(host code, CUDA code) of the session's forward and backward, built for the H100 (no GPU here to ask)."""
    assert shutil.which("nvcc"), "nvcc belongs to the build environment"
    # the SDFGs the session's actions transform, before the CPU build's passes made their maps host loops
    sdfgs = session._states[-1].sdfgs
    with temporary_config():
        Config.set("compiler", "cuda", "cuda_arch", value="90")
        built = build.build([sdfgs.forward, sdfgs.backward], "cuda")
    sources = []
    for binary in built.binaries:
        src = pathlib.Path(binary._lib._library_filename).parents[1] / "src"
        read = lambda folder: "".join(f.read_text() for f in sorted((src / folder).glob("*.c*")))
        sources.append((read("cpu"), read("cuda")))
    return sources


def _program_body(host: str) -> str:
    """The code that runs on every call (not the binary's one-time initialization)."""
    return re.search(r"void __program_\w+_internal\(.*?\n}\n", host, re.S).group(0)


def test_the_fused_mish_builds_for_cuda_without_a_gpu():
    session = dcnb.optimize(Mish(), torch.rand(2, 3, 8, 8), baselines=(), time_budget=0.0)
    assert session.apply("tasklet_fusion").ok
    for _, cuda in _cuda_sources(session):
        assert "__global__" in cuda
        # on PyTorch's stream (the default one), so that kernels wait for the inputs PyTorch is computing
        launches = re.findall(r"cudaLaunchKernel\(.*\);", cuda)
        assert launches and all(launch.endswith(", 0, nullptr);") for launch in launches), launches
        # 256 threads per block (8 rows of 32), not DaCe's one warp
        assert "__launch_bounds__(256)" in cuda


def test_library_nodes_become_kernels():
    # Softmax's forward is one ONNX node and no map: it ran as host loops over device pointers (a segfault)
    session = dcnb.optimize(nn.Softmax(dim=-1), torch.randn(4, 8, 64), baselines=(), time_budget=0.0)
    for host, cuda in _cuda_sources(session):
        assert "__global__" in cuda and "for (" not in host
        # temporaries allocated once per loaded binary, not on every call
        assert "cudaMalloc" in host and "cudaMalloc" not in _program_body(host)


def test_layer_norm_and_accumulated_gradients_build_for_cuda():
    # DaCe's CUDA code generation had no copy that adds into GPU memory (autodiff sums the MLP's gradients so),
    # and passed LayerNorm's scalar epsilon to a kernel by value where a pointer was needed
    module, inputs = CASES["mlp"].build()
    session = dcnb.optimize(module, *inputs, baselines=(), time_budget=0.0)
    assert all("__global__" in cuda for _, cuda in _cuda_sources(session))
