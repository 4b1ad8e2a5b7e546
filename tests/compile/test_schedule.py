"""CPU scheduling of generated code: small maps on one thread, short outer dimensions collapsed."""

import pathlib

import pytest
import torch

import dcnb
from dcnb._src import schedule
from models import Mish

pytestmark = pytest.mark.compile


def _source(binary) -> str:
    library = pathlib.Path(binary._lib._library_filename)
    return next((library.parents[1] / "src" / "cpu").glob("*.cpp")).read_text()


def test_small_maps_run_on_one_thread_and_short_outer_dimensions_are_collapsed(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    tiny = dcnb.optimize(Mish(), torch.rand(4, 16), baselines=(), time_budget=0.0)
    assert "#pragma omp" not in _source(tiny._states[-1].runner.forward_binary)
    # 1 x 4 x 64 x 128 elements: the outer dimensions give 1, then 4, then 256 >= 8 chunks x 2 threads
    wide = dcnb.optimize(Mish(), torch.rand(1, 4, 64, 128), baselines=(), time_budget=0.0)
    assert wide.apply("tasklet_fusion").ok
    for binary in (wide._states[-1].runner.forward_binary, wide._states[-1].runner.backward_binary):
        assert "#pragma omp parallel for collapse(3)" in _source(binary)
    assert schedule.threads() == 2
