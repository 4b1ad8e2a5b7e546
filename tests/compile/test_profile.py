"""Measured time per map and library node (an instrumented copy of the step, built and run apart) beside PyTorch's
profile of eager, on real builds: the zoo's MLP and Mish."""

import json

import pytest
import torch
from dace.sdfg import nodes
from tests.models import Mish
from tests.zoo import CASES

import dcnb
from dcnb._src.views import graph, profile

pytestmark = pytest.mark.compile


def _top_level(sdfg) -> dict[str, str]:
    """guid -> label of the maps, tasklets, library nodes and nested SDFGs outside every map, in the SDFG's own
    states."""
    return {
        n.guid: n.label
        for n, state in sdfg.all_nodes_recursive()
        if isinstance(n, (nodes.MapEntry, nodes.Tasklet, nodes.LibraryNode, nodes.NestedSDFG))
        and state.sdfg is sdfg and state.entry_node(n) is None
    }


def test_every_map_and_library_node_of_the_mlp_is_timed_and_nothing_of_the_session_changes():
    module, (x, target) = CASES["mlp"].build()
    session = dcnb.optimize(module, x, target, baselines=(), time_budget=0.0)
    # what profiling must leave as it was: a gradient the user holds, parameters, the inputs, the step's timing
    module.fc1.weight.grad = held = torch.ones_like(module.fc1.weight)
    params = {name: p.detach().clone() for name, p in module.named_parameters()}
    x_before, timings, history = x.clone(), session.current.timings, session.history
    output = session.module(x, target)

    found = profile.run(session, runs=3)
    json.dumps(found)  # plain data, as the widget sends it

    for side, sdfg in zip(("forward", "backward"), session.compiled_sdfgs()):
        timed = {k["guid"]: k for k in found["kernels"] if k["side"] == side}
        # (a library node's timer is on what code generation made of it: the Einsum's BLAS call, LayerNorm's loops)
        assert timed.keys() == _top_level(sdfg).keys()
        assert all(timed[g]["name"] == label for g, label in _top_level(sdfg).items())
    assert [k["ms"] for k in found["kernels"]] == sorted((k["ms"] for k in found["kernels"]), reverse=True)
    # each node's part of the same calls' time: together at most the whole
    assert found["step_ms"] > 0 and all(k["share"] >= 0 for k in found["kernels"])
    assert 0 < sum(k["share"] for k in found["kernels"]) <= 1
    names = [op["name"] for op in found["torch"]]
    assert "aten::native_layer_norm" in names and {"aten::mm", "aten::addmm"} & set(names)
    assert 0 < found["torch_ms"] and all(op["share"] == op["ms"] / found["torch_ms"] for op in found["torch"])

    assert module.fc1.weight.grad is held and bool((held == 1).all())
    assert all(p.grad is None for name, p in module.named_parameters() if name != "fc1.weight")
    assert all(torch.equal(p, params[name]) for name, p in module.named_parameters())
    assert torch.equal(x, x_before)
    assert session.current.timings is timings and session.history == history
    assert torch.equal(session.module(x, target), output)  # the step's own binaries still run


def test_the_maps_of_a_larger_mish_take_their_share_of_the_call():
    session = dcnb.optimize(Mish(), torch.rand(4, 16, 32, 32), baselines=(), time_budget=0.0)
    found = profile.run(session, runs=3)
    kernels = found["kernels"]
    # five elementwise maps forward, four backward (an accumulator one map fills is written, not zeroed first:
    # passes/gradient_writes.py; softplus's sum passes its gradient on as it is: after_autodiff.shared_gradients)
    assert len(kernels) == 9
    assert kernels[0]["ms"] > 0  # timed (64k elements took 10 us on a fast machine: how fast is a benchmark's)
    # timed inside the call: together less than it (what is left is the call's own overhead)
    assert 0 < sum(k["share"] for k in kernels) <= 1
    names = {op["name"] for op in found["torch"]}
    assert {"aten::tanh", "aten::softplus", "aten::tanh_backward", "aten::softplus_backward"} <= names


def test_the_matrix_products_fuse_rows_expanded_are_timed():
    # fuse_rows expands every library node: a matrix product is then a tasklet calling the BLAS, outside any map
    # (the BERT-mini layer's profile after fuse_rows showed 15.6 of a 65.9 ms step, none of its GEMMs)
    torch.manual_seed(0)
    nn = torch.nn
    module = nn.Sequential(nn.Linear(256, 256), nn.LayerNorm(256))
    session = dcnb.optimize(module, torch.randn(4, 64, 256), baselines=(), time_budget=0.0)
    assert session.apply("fuse_rows").ok
    found = profile.run(session, runs=3)
    for side, sdfg in zip(("forward", "backward"), session.compiled_sdfgs()):
        blas_calls = {
            n.guid
            for n, state in sdfg.all_nodes_recursive()
            if isinstance(n, nodes.Tasklet) and state.entry_node(n) is None and "gemm" in n.code.as_string
        }
        assert blas_calls, side
        timed = {k["guid"] for k in found["kernels"] if k["side"] == side and k["ms"] > 0}
        assert blas_calls <= timed, side
    # the table: a row per op and side, named as the graphs draw the op (a GEMM's BLAS call and its backward's two
    # read as the product's, not einsum_gemmgemm), the kernels of the op summed
    rows = profile.table(session)["rows"]
    assert len({(r["side"], r["name"]) for r in rows}) == len(rows) < len(found["kernels"])
    assert sorted(g for r in rows for g in r["guids"]) == sorted(k["guid"] for k in found["kernels"])
    assert sum(r["ms"] for r in rows) == pytest.approx(sum(k["ms"] for k in found["kernels"]))
    named = {(r["side"], r["name"]) for r in rows}
    assert {("forward", "0 · MatMul"), ("backward", "0 · MatMul (backward)")} <= named
    drawn = {g: how for sdfg in session.compiled_sdfgs() for g, how in graph.named_by_guid(sdfg).items()}
    assert all(drawn[guid].op == r["name"] for r in rows for guid in r["guids"])
    assert not [r["name"] for r in rows if "einsum" in r["name"] or "column_tiles" in r["name"]]


def test_copies_inside_maps_get_no_timer(tmp_path):
    # a LayerNorm's backward after fuse_rows copies rows inside its maps; a timer there would run per row, each
    # reported under one lock (the BERT-mini layer's profile said 443 ms for a 78 ms step)
    torch.manual_seed(0)
    nn = torch.nn
    module = nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 32))
    session = dcnb.optimize(module, torch.randn(4, 8, 32), baselines=(), time_budget=0.0)
    assert session.apply("fuse_rows").ok
    backward = session.compiled_sdfgs()[1]
    timed = profile._instrumented(backward, tmp_path).sdfg
    inside = [
        n.label
        for n, state in timed.all_nodes_recursive()
        if isinstance(n, nodes.Tasklet) and state.entry_node(n) is not None and n.instrument.name == "Timer"
    ]
    assert not inside
