"""The innermost loop of a parallel map of elementwise work written ``omp simd`` (passes/simd_loops.py)."""

import re

import dace
import numpy as np
import pytest
import torch
from dace.sdfg import nodes

import dcnb
from dcnb._src.passes import schedule, simd_loops
from tests.cpu_sources import cpu_source

pytestmark = pytest.mark.compile

ROWS, COLUMNS = 256, 512  # past schedule.GRAIN: a parallel map


def _chain(
    read: str = "a[i, j]", code: str = "__out = tanh(__in * 0.5) + __in", wcr: str | None = None,
    language: dace.Language = dace.Language.Python,
) -> dace.SDFG:
    """An SDFG of one map over ROWS x COLUMNS: out[i, j] from ``read`` through ``code`` (in ``language``)."""
    sdfg = dace.SDFG("chain")
    sdfg.add_array("a", [ROWS, COLUMNS], dace.float32)
    sdfg.add_array("out", [ROWS, COLUMNS], dace.float32)
    state = sdfg.add_state()
    state.add_mapped_tasklet(
        "chain", {"i": f"0:{ROWS}", "j": f"0:{COLUMNS}"}, {"__in": dace.Memlet(read)}, code,
        {"__out": dace.Memlet("out[i, j]", wcr=wcr)}, language=language, external_edges=True,
    )
    schedule.apply(sdfg)
    return sdfg


def _marked(sdfg: dace.SDFG) -> list[nodes.Map]:
    return [
        n.map for n, _ in sdfg.all_nodes_recursive()
        if isinstance(n, nodes.MapEntry) and n.map.instrument == simd_loops.SIMD_LOOP
    ]


def test_a_maps_last_dimension_becomes_an_omp_simd_loop_that_computes_the_same():
    sdfg = _chain()
    assert simd_loops.apply(sdfg) == 1
    (inner,) = _marked(sdfg)
    assert inner.params == ["j"] and inner.schedule == dace.ScheduleType.Sequential
    (outer,) = [n.map for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nodes.MapEntry) and n.map is not inner]
    assert outer.params == ["i"] and outer.schedule == dace.ScheduleType.CPU_Multicore
    code = sdfg.generate_code()[0].clean_code
    assert re.search(r"#pragma omp parallel for\s+for \(\w+ i = 0;.*?#pragma omp simd\s+for \(\w+ j = 0;", code, re.S)
    a = np.random.default_rng(0).standard_normal((ROWS, COLUMNS)).astype(np.float32)
    out = np.zeros_like(a)
    sdfg(a=a, out=out)
    np.testing.assert_allclose(out, np.tanh(a * 0.5) + a, rtol=1e-5, atol=1e-6)


def test_collapsed_leading_dimensions_stay_collapsed():
    sdfg = dace.SDFG("three")
    sdfg.add_array("a", [2, 4, 8192], dace.float32)
    sdfg.add_array("out", [2, 4, 8192], dace.float32)
    state = sdfg.add_state()
    state.add_mapped_tasklet(
        "twice", {"b": "0:2", "i": "0:4", "j": "0:8192"}, {"__in": dace.Memlet("a[b, i, j]")}, "__out = 2 * __in",
        {"__out": dace.Memlet("out[b, i, j]")}, external_edges=True,
    )
    schedule.apply(sdfg)
    (entry,) = [n for n in state.nodes() if isinstance(n, nodes.MapEntry)]
    entry.map.collapse = 2  # as schedule.apply leaves a short outer dimension on more threads
    assert simd_loops.apply(sdfg) == 1
    (outer,) = [n.map for n in state.nodes() if isinstance(n, nodes.MapEntry) and state.entry_node(n) is None]
    assert outer.params == ["b", "i"] and outer.collapse == 2
    assert [m.params for m in _marked(sdfg)] == [["j"]]
    a = np.random.default_rng(1).standard_normal((2, 4, 8192)).astype(np.float32)
    out = np.zeros_like(a)
    sdfg(a=a, out=out)
    np.testing.assert_allclose(out, 2 * a)


@pytest.mark.parametrize(
    "read,code,wcr",
    [
        ("a[j // 2, i]", "__out = __in", None),  # read along a column: a gather
        ("a[i, j]", "__out = __in", "lambda x, y: x + y"),  # a sum: iterations may share an element
        ("a[i, 0:4]", "__out = __in[0] + __in[3]", None),  # four elements an iteration
    ],
)
def test_maps_the_pragma_could_break_or_slow_are_left_as_they_are(read, code, wcr):
    sdfg = _chain(read, code, wcr)
    assert simd_loops.apply(sdfg) == 0 and not _marked(sdfg)


def test_a_cpp_tasklet_of_more_than_one_assignment_is_left_as_it_is():
    # its code may hold loops and pragmas of its own, which an omp simd loop may not
    sdfg = _chain(code="__out = 0;\nfor (int k = 0; k < 2; ++k) __out += __in;", language=dace.Language.CPP)
    assert simd_loops.apply(sdfg) == 0


def test_a_cpp_tasklet_of_one_assignment_runs_in_an_omp_simd_loop():
    # DaCe's ONNX Erf, among others, is such a tasklet
    sdfg = _chain(code="__out = erf(__in * 0.5f);", language=dace.Language.CPP)
    assert simd_loops.apply(sdfg) == 1 and _marked(sdfg)
    a = np.random.default_rng(3).standard_normal((ROWS, COLUMNS)).astype(np.float32)
    out = np.zeros_like(a)
    sdfg(a=a, out=out)
    np.testing.assert_allclose(out, torch.erf(torch.from_numpy(a) * 0.5).numpy(), rtol=1e-5, atol=1e-6)


def test_auto_optimizes_fused_gelu_runs_in_an_omp_simd_loop():
    # auto_optimize fuses a Linear's bias add with GELU's elementwise ops into one map writing what the backward
    # keeps: GCC left its loop scalar (tanh one element at a time) where the pragma vectorizes it
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(approximate="tanh"))
    session = dcnb.optimize(module, torch.randn(512, 64), baselines=(), time_budget=0.0)
    step = session.apply("auto_optimize")
    assert step.ok, step.error
    source = cpu_source(session._states[-1].runner.forward_binary)
    assert re.search(r"#pragma omp simd\s+for \(\w+ \w+ = 0; \w+ < 256;.*?tanh\(", source, re.S)


def test_fuse_rows_loops_along_a_row_run_as_omp_simd_loops():
    # fuse_rows leaves a Linear's bias add and GELU's erf chain in a sequential loop along each row, inside its
    # parallel map over rows: GCC left that loop scalar, erf one element at a time
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 32))
    session = dcnb.optimize(module, torch.randn(8, 64, 64), baselines=(), time_budget=0.0)
    step = session.apply("fuse_rows")
    assert step.ok, step.error
    source = cpu_source(session._states[-1].runner.forward_binary)
    loop = r"#pragma omp simd\s+for \(\w+ \w+ = 0; \w+ < 256;[^#]*?erf\("
    assert re.search(r"#pragma omp parallel for.*?" + loop, source, re.S)


def test_a_loop_copying_across_a_row_is_left_as_it_is():
    # a copy from an iteration's element into a column of another array scatters: the pragma would force it
    sdfg = dace.SDFG("scatter")
    sdfg.add_array("a", [ROWS, COLUMNS], dace.float32)
    sdfg.add_array("out", [COLUMNS, ROWS], dace.float32)
    sdfg.add_transient("one", [1], dace.float32)
    state = sdfg.add_state()
    outer_entry, outer_exit = state.add_map("rows", {"i": f"0:{ROWS}"}, schedule=dace.ScheduleType.CPU_Multicore)
    inner_entry, inner_exit = state.add_map("along", {"j": f"0:{COLUMNS}"}, schedule=dace.ScheduleType.Sequential)
    tasklet = state.add_tasklet("twice", {"__in"}, {"__out"}, "__out = 2 * __in")
    one = state.add_access("one")
    state.add_memlet_path(state.add_read("a"), outer_entry, inner_entry, tasklet, dst_conn="__in",
                          memlet=dace.Memlet("a[i, j]"))
    state.add_edge(tasklet, "__out", one, None, dace.Memlet("one[0]"))
    inner_exit.add_in_connector("IN_out"), inner_exit.add_out_connector("OUT_out")
    outer_exit.add_in_connector("IN_out"), outer_exit.add_out_connector("OUT_out")
    state.add_edge(one, None, inner_exit, "IN_out", dace.Memlet(data="one", subset="0", other_subset="j, i"))
    state.add_edge(inner_exit, "OUT_out", outer_exit, "IN_out", dace.Memlet(f"out[0:{COLUMNS}, i]"))
    state.add_edge(outer_exit, "OUT_out", state.add_write("out"), None, dace.Memlet(f"out[0:{COLUMNS}, 0:{ROWS}]"))
    sdfg.validate()
    assert simd_loops.apply(sdfg) == 0 and not _marked(sdfg)
    a = np.random.default_rng(2).standard_normal((ROWS, COLUMNS)).astype(np.float32)
    out = np.zeros((COLUMNS, ROWS), np.float32)
    sdfg(a=a, out=out)
    np.testing.assert_allclose(out, 2 * a.T)
