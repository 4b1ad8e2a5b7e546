"""Builds from a cold machine: nothing cached, neither dcnb's builds nor DaCe's precompiled header."""

import contextlib
import copy
import os
import time

import pytest
import torch
from dace.codegen import codegen, compiler
from torch import nn

import dcnb
from dcnb._src import actions, build, dace_internals
from dcnb._src import session as session_module
from dcnb._src.fixes import reduce_node
from dcnb._src.recipe import Entry
from tests.models import Mish

pytestmark = pytest.mark.compile


def test_a_cold_build_cache_prepares_the_precompiled_header_before_the_parallel_compiles(
    fresh_cache, tmp_path, monkeypatch
):
    # DaCe stages its precompiled header under the process id: two threads building it at once corrupted it. Each
    # SDFG now generates and compiles in a process of its own (stoppable), which builds the header under a lock:
    # once, before any compile asks for it
    monkeypatch.setenv("DACE_BUILD_CACHE_DIR", str(tmp_path / "dace"))
    calls = tmp_path / "calls"
    prepare = compiler.prepare_precompiled_header

    def spy(targets):
        start = time.time()
        result = prepare(targets)
        with open(calls, "a") as f:  # the calls happen in the compile processes: they report through a file
            f.write(f"{os.getpid()} {start} {time.time()}\n")
        return result

    monkeypatch.setattr(compiler, "prepare_precompiled_header", spy)
    session = dcnb.optimize(Mish(), torch.rand(2, 3, 5, 7), baselines=(), time_budget=0.05)
    assert session.current.ok and session.current.compile_seconds > 0
    lines = [line.split() for line in calls.read_text().splitlines()]
    built, *asked = sorted((float(start), float(end), int(pid)) for pid, start, end in lines)
    assert len({built[2], *(c[2] for c in asked)} - {os.getpid()}) == 2  # the forward's and the backward's
    assert asked and all(built[1] <= c[0] for c in asked)  # ready before any other call asks for it
    assert len(list((tmp_path / "dace").rglob("pch/*/*.gch"))) == 1


def test_the_compile_threads_build_with_the_callers_dace_configuration(fresh_cache):
    # DaCe's Config is per thread: the compile threads built with the defaults, without the flags in the cache key
    from dace.config import Config, temporary_config

    with temporary_config():
        Config.set("compiler", "cpu", "args", value=Config.get("compiler", "cpu", "args") + " -DDCNB_PROBE=1")
        session = dcnb.optimize(Mish(), torch.rand(2, 3, 5, 7), baselines=(), time_budget=0.05)
    assert session.current.ok
    commands = list(fresh_cache.rglob("compile_commands.json"))
    assert len(commands) == 2 and all("-DDCNB_PROBE=1" in c.read_text() for c in commands)


def test_only_code_that_sums_along_loops_compiles_with_reassociation_and_unrolling(fresh_cache):
    # GCC vectorizes fuse_rows' row sums only where it may reassociate them; Mish's code ran 27% slower with it
    # shapes of their own: a binary this process built before would not be built again
    session = dcnb.optimize(Mish(), torch.rand(3, 2, 7, 5), baselines=(), time_budget=0.05)
    rows = dcnb.optimize(torch.nn.LayerNorm(32), torch.randn(4, 64, 32), baselines=(), time_budget=0.05)
    assert session.current.ok and rows.apply("fuse_rows").ok
    commands = {c.parent.parent.name: c.read_text() for c in fresh_cache.rglob("compile_commands.json")}
    reassociating = sorted(
        name.rsplit("_", 1)[0]
        for name, text in commands.items()
        if "-fassociative-math" in text and "-funroll-loops" in text
    )
    assert len(commands) == 6 and reassociating == ["LayerNorm", "LayerNorm_backward"], commands.keys()


def test_only_a_large_sdfg_s_code_is_optimized_at_its_link(fresh_cache):
    # GCC optimizes one source file on one core; at the link it does so in partitions, one per core (a 12-layer
    # BERT's backward: 5.3-8.7 s where it took 10.6-17.4 on 2 cores), at a cost a small SDFG's code does not repay
    blocks = nn.Sequential(*(nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.LayerNorm(16)) for _ in range(4)))
    session = dcnb.optimize(blocks, torch.randn(4, 16), baselines=(), time_budget=0.0)
    assert session.current.ok
    sizes = [build.nodes_in(side) for side in (session.forward_sdfg, session.backward_sdfg)]
    assert sizes[0] < build.LINK_TIME_AT <= sizes[1], sizes
    commands = {c.parent.parent.name: c.read_text() for c in fresh_cache.rglob("compile_commands.json")}
    linked = sorted(name.rsplit("_", 1)[0] for name, text in commands.items() if "-flto" in text)
    assert len(commands) == 2 and linked == ["Sequential_backward"], commands.keys()


def _code(sdfg, reused: bool) -> list[str]:
    with build._configured("cpu", None), dace_internals.expansions_reused() if reused else contextlib.nullcontext():
        return [o.clean_code for o in codegen.generate_code(copy.deepcopy(sdfg), validate=True)]


def test_identical_layers_expand_once_at_code_generation_into_the_same_code(fresh_cache, calls):
    # gap: DaCe runs every library node's expansion anew, the same ops of every layer again (1,824 in a 12-layer
    # BERT's backward, whose code generation took 27-29 s so, 20-23 s reused); dcnb's Reduce expansions also rename
    # connectors
    blocks = nn.Sequential(*(nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.LayerNorm(16)) for _ in range(4)))
    session = dcnb.optimize(blocks, torch.randn(4, 16), baselines=(), time_budget=0.0)
    assert session.current.ok
    expanded = calls(reduce_node, "_nested")  # the start of each of dcnb's Reduce expansions
    anew = _code(session.backward_sdfg, reused=False)
    each, expanded[:] = len(expanded), []
    assert _code(session.backward_sdfg, reused=True) == anew
    assert each >= 8 and len(expanded) <= each // 4, (each, len(expanded))


@pytest.mark.deep
def test_identical_layers_expand_once_in_an_action(fresh_cache, calls):
    # an action's expansions are reused as code generation's are: auto_optimize expands the ONNX ops of a 12-layer
    # BERT's backward, then their products and reductions (1,867), 4.5 of its 110 s less with them reused
    blocks = nn.Sequential(*(nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.LayerNorm(16)) for _ in range(4)))
    session = dcnb.optimize(blocks, torch.randn(4, 16), baselines=(), time_budget=0.0)
    backward = session.calls().program.backward
    expanded = calls(reduce_node, "_nested")
    actions.get("auto_optimize").run(copy.deepcopy(backward), None, {}, "cpu")
    each, expanded[:] = len(expanded), []
    assert session_module._run(actions.get("auto_optimize"), copy.deepcopy(backward), Entry("auto_optimize"), "cpu")
    assert each >= 8 and len(expanded) <= each // 4, (each, len(expanded))


class _Window(nn.Module):
    def __init__(self, start: int):
        super().__init__()
        self.start = start

    def forward(self, x):
        return x[:, self.start : self.start + 4] * 2


def test_modules_differing_only_in_an_onnx_constant_do_not_share_a_binary(fresh_cache):
    # Slice's starts are ONNX constants that its backward's expansion reads at code generation, outside the hash
    x = torch.randn(4, 16)
    for start in (0, 3):
        session = dcnb.optimize(_Window(start), x, baselines=(), time_budget=0.0)
        assert session.current.check.ok
