"""fuse_rows' GPU form (rows.to_warps) built for the H100 on a machine without a GPU: a warp per row, the column
loops strided over its lanes, the row sums combined with shuffles. Running it needs a GPU (not yet done)."""

import copy
import pathlib
import re
import shutil

import pytest
import torch
from dace.config import Config, temporary_config
from torch import nn

import dcnb
from dcnb._src import build
from dcnb._src.actions import rows

pytestmark = [pytest.mark.compile, pytest.mark.cuda]


@pytest.mark.parametrize("module", [nn.Softmax(dim=-1), nn.LayerNorm(64)], ids=["softmax", "layernorm"])
def test_rows_build_for_cuda_with_a_warp_per_row(module):
    assert shutil.which("nvcc"), "nvcc belongs to the build environment"
    session = dcnb.optimize(module, torch.randn(4, 8, 64), baselines=(), time_budget=0.0)
    assert session.apply("fuse_rows").ok
    sdfgs = session._states[-1].sdfgs
    warped = [copy.deepcopy(sdfg) for sdfg in (sdfgs.forward, sdfgs.backward)]
    assert all(rows.to_warps(sdfg) >= 1 for sdfg in warped)
    with temporary_config():
        Config.set("compiler", "cuda", "cuda_arch", value="90")
        built = build.build(warped, "cuda")
    forward, backward = (_cuda(binary.sdfg.build_folder) for binary in built.binaries)
    for cuda in (forward, backward):
        assert "__launch_bounds__(32)" in cuda  # a block is one warp, a row's
        # each lane takes every 32nd column from its own on
        assert re.search(r"for \(int (\w+) = [^;]*; \1 < [^;]*__tid[^;]*; \1 \+= 32\)", cuda)
    assert "dace::warpReduce<dace::ReductionType::Sum" in forward  # a row's sum, combined across the lanes


def _cuda(build_folder: str) -> str:
    return "".join(f.read_text() for f in sorted((pathlib.Path(build_folder) / "src" / "cuda").glob("*.cu")))
