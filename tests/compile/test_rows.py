"""fuse_rows: Softmax and LayerNorm, forward and backward, as parallel maps over rows without atomics."""

import pathlib

import pytest
import torch
from torch import nn

import dcnb

pytestmark = pytest.mark.compile


def _source(binary) -> str:
    library = pathlib.Path(binary._lib._library_filename)
    return next((library.parents[1] / "src" / "cpu").glob("*.cpp")).read_text()


@pytest.mark.parametrize("module", [nn.Softmax(dim=-1), nn.LayerNorm(32)])
def test_rows_fuse_into_parallel_maps_and_stay_right(module):
    torch.manual_seed(0)
    session = dcnb.optimize(module, torch.randn(4, 64, 32), baselines=(), time_budget=0.0)
    assert {o.name: o.matches for o in session.actions()}["fuse_rows"] > 0
    step = session.apply("fuse_rows")
    assert step.ok and step.check.ok, step.error
    naive = session.history[0]
    assert step.counts["forward"]["kernels"] == 1
    # LayerNorm's backward also sums its weight and bias gradients over the rows: more than one map remains
    assert step.counts["backward"]["kernels"] < naive.counts["backward"]["library_nodes"] + naive.counts["backward"]["kernels"]
    runner = session._states[-1].runner
    for binary in (runner.forward_binary, runner.backward_binary):
        code = _source(binary)
        assert "reduce_atomic" not in code and "#pragma omp parallel for" in code
    # the naive build reduces with atomics, which is what this replaces
    assert "reduce_atomic" in _source(session._states[0].runner.forward_binary)
