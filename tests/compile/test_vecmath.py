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


@pytest.mark.parametrize("training", [False, True])
def test_a_float_constant_in_vectorized_code_is_a_float(training):
    # after auto_optimize a BatchNorm's scale is one map of ``1.0 / sqrt(x + 1e-05)``, whose 1e-05 DaCe wrote as a
    # double: GCC converts no double to a vector of floats that would lose digits, and the code did not compile
    # (the search found it on ResNet: auto_optimize, then vectorization)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    session = dcnb.optimize(module.train(training), torch.rand(2, 3, 16, 16), baselines=(), time_budget=0.0)
    assert session.apply("auto_optimize").ok
    step = session.apply("vectorization")
    assert step.ok and step.check.ok, step.error
    source = cpu_source(session._states[-1].runner.forward_binary)
    assert "dace::vec<float" in source and "+ float(1e-05)" in source  # dace.float32(1e-05), as DaCe writes it


def test_maps_passing_values_through_a_transient_of_one_name_are_merged_each_on_its_own():
    # auto_optimize's column sums leave maps in one state that each pass a value through their own access node of
    # one transient (GPT-2's backward after fuse_rows and auto_optimize): merging the first took the others' nodes
    import dace
    import numpy as np

    from dcnb._src.actions.vectorize import merge_tasklets

    n = 16
    sdfg = dace.SDFG("shared_transient")
    for name in ("a", "b", "c"):
        sdfg.add_array(name, [n], dace.float32)
    sdfg.add_array("t", [1], dace.float32, transient=True)
    state = sdfg.add_state()
    a = state.add_access("a")
    for out, factor in (("b", 2), ("c", 3)):
        entry, exit_ = state.add_map(f"m_{out}", {"i": f"0:{n}"})
        scale = state.add_tasklet(f"scale_{out}", {"x"}, {"y"}, f"y = x * {factor}")
        shift = state.add_tasklet(f"shift_{out}", {"x"}, {"y"}, "y = x + 1")
        passed = state.add_access("t")
        state.add_memlet_path(a, entry, scale, dst_conn="x", memlet=dace.Memlet("a[i]"))
        state.add_edge(scale, "y", passed, None, dace.Memlet("t[0]"))
        state.add_edge(passed, None, shift, "x", dace.Memlet("t[0]"))
        state.add_memlet_path(shift, exit_, state.add_access(out), src_conn="y", memlet=dace.Memlet(f"{out}[i]"))
    assert merge_tasklets(sdfg, None) == 2
    sdfg.validate()
    x = np.random.rand(n).astype(np.float32)
    b, c = np.zeros(n, np.float32), np.zeros(n, np.float32)
    sdfg(a=x, b=b, c=c)
    np.testing.assert_allclose(b, 2 * x + 1, rtol=1e-6)
    np.testing.assert_allclose(c, 3 * x + 1, rtol=1e-6)


def test_a_map_of_tasklets_that_read_nothing_is_merged_inside_the_map():
    # the resets of fuse_rows' column sums after auto_optimize: one map of independent tasklets, each writing a
    # constant, sitting in the map by empty memlets; merged without one, the tasklet fell out of the map's scope
    import dace
    import numpy as np

    from dcnb._src.actions.vectorize import merge_tasklets

    n = 16
    sdfg = dace.SDFG("resets")
    state = sdfg.add_state()
    entry, exit_ = state.add_map("reset", {"i": f"0:{n}"})
    for name, value in (("b", 1), ("c", 2)):
        sdfg.add_array(name, [n], dace.float32)
        tasklet = state.add_tasklet(f"reset_{name}", {}, {"y"}, f"y = {value}")
        state.add_nedge(entry, tasklet, dace.Memlet())
        state.add_memlet_path(tasklet, exit_, state.add_access(name), src_conn="y", memlet=dace.Memlet(f"{name}[i]"))
    assert merge_tasklets(sdfg, None) == 1
    sdfg.validate()
    b, c = np.zeros(n, np.float32), np.zeros(n, np.float32)
    sdfg(b=b, c=c)
    np.testing.assert_array_equal(b, np.ones(n, np.float32))
    np.testing.assert_array_equal(c, np.full(n, 2, np.float32))


def test_a_tasklet_subscripting_an_array_connector_is_not_vectorized():
    # a Gather's backward (ViT's and BERT's [CLS] token): ``__data_gradient[idx] = ...`` adds into x[i0, 0:5, i1],
    # its connectors untyped; DaCe's Vectorization gave the memlet a vector range in its last dimension, one more
    # dimension than the code's subscript, and the SDFG failed validation
    import dace

    from dcnb._src.actions import vectorize

    sdfg = dace.SDFG("gather_backward")
    sdfg.add_array("g", [2, 16], dace.float32)
    sdfg.add_array("indices", [1], dace.int64)
    sdfg.add_array("dx", [2, 5, 16], dace.float32)
    state = sdfg.add_state()
    state.add_mapped_tasklet(
        "gather_backward",
        {"i0": "0:2", "i1": "0:16"},
        {"__g": dace.Memlet("g[i0, i1]"), "idx": dace.Memlet("indices[0]")},
        "__dx[idx] = __g",
        {"__dx": dace.Memlet("dx[i0, 0:5, i1]", wcr="lambda a, b: a + b")},
        external_edges=True,
    )
    sdfg.validate()
    applied = vectorize.apply(sdfg, None, {"vector_len": 4})
    sdfg.validate()  # before the fix: "Subscript expression "__dx[idx]" contains an invalid number of dimensions"
    assert applied == 0


def test_bools_are_not_vectorized():
    # BERT's attention mask broadcast after expand: a map copying bools, which DaCe's Vectorization took; DaCe's
    # runtime has no vector of bools and the code did not compile ("incomplete type dace::_vtype<bool, 8>")
    import dace
    import numpy as np

    from dcnb._src.actions import vectorize

    sdfg = dace.SDFG("bool_copy")
    sdfg.add_array("a", [2, 16], dace.bool_)
    sdfg.add_array("b", [2, 16], dace.bool_)
    state = sdfg.add_state()
    state.add_mapped_tasklet(
        "copy", {"i0": "0:2", "i1": "0:16"}, {"__in": dace.Memlet("a[i0, i1]")}, "__out = __in",
        {"__out": dace.Memlet("b[i0, i1]")}, external_edges=True,
    )
    applied = vectorize.apply(sdfg, None, {"vector_len": 4})
    a = np.random.rand(2, 16) > 0.5
    b = np.zeros_like(a)
    sdfg(a=a, b=b)  # before the fix: the code did not compile
    np.testing.assert_array_equal(b, a)
    assert applied == 0
