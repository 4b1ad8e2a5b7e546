"""Math in generated CPU code: float functions stay in float, and loops calling them use libmvec's vector variants."""

import subprocess

import pytest
import torch
from dace.sdfg import nodes

import dcnb
from tests.cpu_sources import cpu_source
from tests.models import Mish

pytestmark = pytest.mark.compile


def _imports(binary) -> set[str]:
    library = binary._lib._library_filename
    listing = subprocess.run(["nm", "-D", "--undefined-only", library], capture_output=True, text=True, check=True)
    return {line.split()[-1].split("@")[0] for line in listing.stdout.splitlines() if line.strip()}


def test_scalar_float_code_calls_float_math_vectorized_by_the_compiler():
    session = dcnb.optimize(Mish(), torch.rand(2, 4, 16, 16), baselines=(), time_budget=0.0)
    imports = _imports(session._states[-1].runner.forward_binary)
    # before the fix, exp(float) resolved to ::exp(double): a scalar double call per element
    assert not {"exp", "log", "tanh"} & imports
    assert any(name.startswith("_ZGV") and name.endswith("_expf") for name in imports), sorted(imports)


@pytest.mark.parametrize("shape, vectorized", [((2, 3, 4, 12), True), ((2, 3, 4, 6), False)])
def test_vectorization_takes_whole_vectors_only_and_accepts_misaligned_views(shape, vectorized):
    # rows of 12 floats fit vectors of 4 only; rows of 6 fit none (DaCe would split them forever)
    session = dcnb.optimize(Mish(), torch.rand(*shape), baselines=(), time_budget=0.0)
    session.apply("tasklet_fusion")
    step = session.apply("vectorization")
    assert step.ok is vectorized, step.error
    if vectorized:
        storage = torch.rand(torch.Size(shape).numel() + 1)
        view = storage[1:].reshape(shape)  # contiguous, but 4 bytes past an aligned start
        torch.testing.assert_close(session.module(view), Mish()(view))


def test_a_map_of_several_tasklets_is_vectorized_as_one():
    # auto_optimize leaves a SiLU as one map of two tasklets, the sigmoid stored for the backward and passed to the
    # product; DaCe's Vectorization takes maps of one tasklet (EfficientNet-B0's forward: 12.9 of 150 ms, scalar)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 1), torch.nn.BatchNorm2d(8), torch.nn.SiLU())
    session = dcnb.optimize(module.train(), torch.randn(2, 8, 8, 16), training=True, baselines=(), time_budget=0.0)
    assert session.apply("auto_optimize").ok
    step = session.apply("vectorization")
    assert step.ok and step.check.ok, step.error
    silu = [n for n, _ in session.forward_sdfg.all_nodes_recursive() if isinstance(n, nodes.Tasklet) and "Mult" in n.label]
    assert silu and all(len(n.out_connectors) == 2 for n in silu), [n.label for n in silu]  # product and sigmoid
    assert "dace::vec<float" in cpu_source(session._states[-1].runner.forward_binary)
