"""The CUDA path on a machine without a GPU: DaCe's CUDA code generation and nvcc build the Mish recipe's SDFGs.

Running them needs a GPU (the device is checked where one is lent); what can break without one is caught here.
"""

import pathlib
import shutil

import pytest
import torch
from dace.config import Config, temporary_config

import dcnb
from dcnb._src import build
from models import Mish

pytestmark = pytest.mark.compile


def test_the_fused_mish_builds_for_cuda_without_a_gpu():
    assert shutil.which("nvcc"), "nvcc belongs to the build environment"
    session = dcnb.optimize(Mish(), torch.rand(2, 3, 8, 8), baselines=(), time_budget=0.0)
    assert session.apply("tasklet_fusion").ok
    with temporary_config():
        # no GPU to take the architecture from ("native"): the H100's
        Config.set("compiler", "cuda", "cuda_arch", value="90")
        built = build.build([session.forward_sdfg, session.backward_sdfg], "cuda")
    for binary in built.binaries:
        folder = pathlib.Path(binary._lib._library_filename).parents[1] / "src" / "cuda"
        assert "__global__" in "".join(f.read_text() for f in folder.glob("*.cu"))
