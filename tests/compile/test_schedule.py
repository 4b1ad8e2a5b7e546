"""CPU scheduling of generated code: small maps on one thread, short outer dimensions collapsed, sums no two
iterations share without atomics."""

import dace
import pytest
import torch

import dcnb
from dcnb._src import passes
from dcnb._src.passes import schedule
from tests.cpu_sources import cpu_source
from tests.models import Mish

pytestmark = pytest.mark.compile


def test_small_maps_run_on_one_thread_and_short_outer_dimensions_are_collapsed(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    tiny = dcnb.optimize(Mish(), torch.rand(4, 16), baselines=(), time_budget=0.0)
    assert "#pragma omp" not in cpu_source(tiny._states[-1].runner.forward_binary)
    # 2 x 4 x 64 x 128 elements: the outer dimensions give 2, then 8, then 512 >= 8 chunks x 2 threads
    wide = dcnb.optimize(Mish(), torch.rand(2, 4, 64, 128), baselines=(), time_budget=0.0)
    assert wide.apply("tasklet_fusion").ok
    for binary in (wide._states[-1].runner.forward_binary, wide._states[-1].runner.backward_binary):
        assert "#pragma omp parallel for collapse(3)" in cpu_source(binary)
    assert schedule.threads() == 2


def _sums(ranges: dict[str, str], index: str) -> dace.SDFG:
    """An SDFG of one map over ``ranges`` adding a[...] into out[index]."""
    sdfg = dace.SDFG("sums")
    sdfg.add_array("a", [64, 64], dace.float32)
    sdfg.add_array("out", [64, 64], dace.float32)
    state = sdfg.add_state()
    state.add_mapped_tasklet(
        "add", ranges, {"__in": dace.Memlet("a[0, 0]")}, "__out = __in",
        {"__out": dace.Memlet(f"out[{index}]", wcr="lambda x, y: x + y")}, external_edges=True,
    )
    return sdfg


@pytest.mark.parametrize(
    "ranges,index,own",
    [
        ({"i": "0:64", "j": "0:64"}, "i, j", True),
        ({"i": "0:64", "j": "0:64:4"}, "i, j:j + 4", True),  # a vector of 4 per iteration, 4 apart
        ({"i": "0:32", "j": "0:64"}, "2 * i + 1, j", True),
        ({"i": "0:64", "j": "0:64:2"}, "i, j:j + 4", False),  # vectors of 4, 2 apart: they overlap
        ({"i": "0:64", "j": "0:64"}, "i, 0", False),  # every j adds into one element
        ({"i": "0:8", "j": "0:8"}, "i + j, 0", False),
        ({"i": "0:64", "j": "0:64"}, "i, j * j", False),
    ],
)
def test_sums_no_two_iterations_share_are_not_atomic(ranges, index, own):
    sdfg = _sums(ranges, index)
    assert schedule.own_element_sums(sdfg) == int(own)
    memlets = [e.data for e, _ in sdfg.all_edges_recursive() if getattr(e.data, "wcr", None) is not None]
    assert memlets and all(m.wcr_nonatomic == own for m in memlets)


def _tiled_sums(rows: str) -> dace.SDFG:
    """An SDFG of a map over 8 tiles around a map over ``rows`` (of tile c) and 64 columns, adding into out[i, j]."""
    sdfg = dace.SDFG("tiled_sums")
    sdfg.add_array("a", [64, 64], dace.float32)
    sdfg.add_array("out", [80, 64], dace.float32)
    state = sdfg.add_state()
    outer_entry, outer_exit = state.add_map("tiles", {"c": "0:8"})
    entry, exit_ = state.add_map("rows", {"i": rows, "j": "0:64"})
    add = state.add_tasklet("add", {"__in"}, {"__out"}, "__out = __in")
    state.add_memlet_path(state.add_read("a"), outer_entry, entry, add, dst_conn="__in", memlet=dace.Memlet("a[0, 0]"))
    state.add_memlet_path(
        add, exit_, outer_exit, state.add_write("out"), src_conn="__out",
        memlet=dace.Memlet("out[i, j]", wcr="lambda x, y: x + y"),
    )
    return sdfg


@pytest.mark.parametrize("rows,own", [("8 * c:8 * c + 8", True), ("c", True), ("c:c + 16", False)])
def test_sums_in_tiles_of_their_own_are_not_atomic(rows, own):
    # fuse_rows' partial sums run a row map per chunk of rows: out[i, j] names no chunk, each chunk's rows its own
    # (a BERT-mini layer's LayerNorm and GELU backward maps added into gradients atomically: 1.5 of 25.8 ms)
    sdfg = _tiled_sums(rows)
    assert schedule.own_element_sums(sdfg) == int(own)
    memlets = [e.data for e, _ in sdfg.all_edges_recursive() if e.data.wcr is not None]
    assert memlets and all(m.wcr_nonatomic == own for m in memlets)


class _Steps(torch.nn.Module):
    def forward(self, x):
        return (x[1:] - x[:-1]).sum() + x


def test_a_map_adding_into_one_array_twice_keeps_its_atomics():
    # the backward of x[1:] - x[:-1] adds into x's gradient at i + 1 and at i: each write alone has elements of its
    # own, together iterations share them; made plain additions, x's gradient was off by 0.21
    torch.manual_seed(0)
    session = dcnb.optimize(_Steps(), torch.randn(4, 8), baselines=(), time_budget=0.0)
    assert session.current.ok and session.current.check.ok, session.current.error
    assert "grad x" in session.current.check.errors


class _Square(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x) * torch.tanh(x)


def test_a_square_s_two_parts_of_one_element_are_added_without_atomics():
    # a square's gradient adds its two factors' parts into the one element of each iteration: two edges, one index;
    # kept atomic, a BatchNorm's backward in training mode (8x64x112x112) spent 45 of its 106 ms in that map
    torch.manual_seed(0)
    session = dcnb.optimize(_Square(), torch.randn(8, 64), baselines=(), time_budget=0.0)
    assert session.current.ok and session.current.check.ok, session.current.error
    assert "reduce_atomic" not in cpu_source(session._states[-1].runner.backward_binary)


def test_the_parts_of_a_gradient_are_added_without_atomics():
    torch.manual_seed(0)
    # x's gradient comes from LayerNorm's backward (a nested SDFG, added in by a map of its own) and from the product
    norm = torch.nn.LayerNorm(64)

    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = norm

        def forward(self, x):
            return self.norm(x) * x

    session = dcnb.optimize(Residual(), torch.randn(8, 64, 64), baselines=(), time_budget=0.0)
    assert session.current.check.ok
    source = cpu_source(session._states[-1].runner.backward_binary)
    tasklets = source.split("// Tasklet code (")
    added = [t for t in tasklets if t.startswith("accumulate_gradient_x")]
    assert added and not any("reduce_atomic" in t.split("}")[0] for t in added)


def _sum_into_a_transient(read_after: bool, parts: int = 1) -> dace.SDFG:
    """A map adding a[i] into a transient t inside its scope (``parts`` times, one tasklet each), then copying t out
    (and reading t after the map)."""
    sdfg = dace.SDFG("of_the_iteration")
    sdfg.add_array("a", [64], dace.float32)
    sdfg.add_array("out", [64], dace.float32)
    sdfg.add_transient("t", [1], dace.float32)
    state = sdfg.add_state()
    entry, exit_ = state.add_map("m", {"i": "0:64"})
    copy = state.add_tasklet("copy", {"__in"}, {"__out"}, "__out = __in")
    t, a = state.add_access("t"), state.add_read("a")
    for part in range(parts):
        add = state.add_tasklet(f"add{part}", {"__in"}, {"__out"}, "__out = __in")
        state.add_memlet_path(a, entry, add, dst_conn="__in", memlet=dace.Memlet("a[i]"))
        state.add_edge(add, "__out", t, None, dace.Memlet("t[0]", wcr="lambda x, y: x + y"))
    state.add_edge(t, None, copy, "__in", dace.Memlet("t[0]"))
    state.add_memlet_path(copy, exit_, state.add_write("out"), src_conn="__out", memlet=dace.Memlet("out[i]"))
    if read_after:
        after = sdfg.add_state_after(state)
        after.add_edge(after.add_read("t"), None, after.add_write("out"), None, dace.Memlet("t[0] -> [0]"))
    return sdfg


@pytest.mark.parametrize("read_after", [False, True])
def test_sums_into_a_transient_of_each_iteration_are_not_atomic(read_after):
    # subgraph fusion leaves a BatchNorm's gradient as such a transient, its parts added into it in each iteration
    # (EfficientNet's auto_optimize step spent 3 ms of 5.7 in five of those sums, atomic)
    sdfg = _sum_into_a_transient(read_after)
    assert schedule.iteration_sums(sdfg) == int(not read_after)
    [memlet] = [e.data for e, _ in sdfg.all_edges_recursive() if getattr(e.data, "wcr", None) is not None]
    assert memlet.wcr_nonatomic == (not read_after)


def test_a_kernel_adds_into_its_own_registers_without_atomics():
    # an atomic addition into a thread's registers is an illegal address on a GPU: auto_optimize's fused backward maps
    # stopped with "unspecified launch failure" on an H100 (GPT-2, Llama, BERT, ViT, ConvNeXt, Mixer, ResNet)
    sdfg = _sum_into_a_transient(read_after=False, parts=2)  # two parts into one element: DaCe makes them atomic
    passes.run(passes.CUDA_BUILD, sdfg)
    [kernels] = [code.clean_code for code in sdfg.generate_code() if code.language == "cu"]
    assert "float t[1]" in kernels, kernels  # t lives in each thread
    assert "__global__" in kernels and "reduce_atomic" not in kernels
