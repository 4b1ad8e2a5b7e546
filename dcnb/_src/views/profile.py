"""Measured time of each map and library node of the current step, beside PyTorch's profile of eager on the same
inputs: the widget's heat colouring and its table of top kernels.

A step's own timing calls the step's binaries, which time nothing inside. Here a copy of each compiled SDFG has
DaCe's ``Timer`` instrumentation on its top-level maps, tasklets, library nodes and nested SDFGs (the latter two
through what they expand to and their states: see ``_instrumented``). It is generated under the configuration its
build saved (``dace.conf``), with the compiler flags the build adds (``build._own_args``), compiled into a folder
of its own (the build cache's key leaves instrumentation out, so the cache would hand back the uninstrumented
binary), and called through a ``Runner`` of its own, forward and backward as the session times a step, on the
session's inputs and upstream gradients (``Session.calls``). DaCe writes its timers' report when a binary is
finalized; each node's time is the median over the calls, the first left out. The instrumented binaries call
DaCe's Python entry (they have no entry for dcnb's C++ call path), whose overhead is in the call's time, in no node's.

Nothing of the session changes: its states, binaries and timings are not touched, and the user's module is left as
it was (``verify.preserved``: parameters, their gradients, buffers, training flags; the inputs are copies). The
GPU's kernels run asynchronously to a host timer: on CUDA this is refused (GPU events would be needed).
"""

from __future__ import annotations

import copy
import pathlib
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import dace
import torch
from dace.codegen import codegen, compiler
from dace.codegen.compiled_sdfg import CompiledSDFG
from dace.config import Config, temporary_config
from dace.libraries.standard.nodes.copy.node import CopyLibraryNode
from dace.sdfg import infer_types, nodes
from dace.transformation.passes.insert_explicit_copies import InsertExplicitCopies

from .. import build, cache, names
from ..errors import DcnbError
from ..module import Runner
from . import graph
from .sources import expansions

#: top ops of PyTorch's profile kept
TOP_OPS = 20
#: what ``run`` measured of a step is kept as in its analysis (``Session.analysis``), where the views read it
NAME = "profile"


def run(session: Any, runs: int = 5) -> dict[str, Any]:
    """Time the current step's maps and library nodes, and profile PyTorch eager on the same inputs, each over
    ``runs`` calls of forward and backward (after one warm-up)::

        {"kernels": [{"guid", "name", "side": "forward" | "backward", "ms", "share"}, ...],  # by ms, largest first
         "step_ms": the median instrumented call,
         "torch": [{"name", "ms", "share"}, ...],  # PyTorch's top ops by their own time
         "torch_ms": the median eager call (under the profiler)}

    ``ms`` is per call (the median); ``share`` is the node's part of those calls' time (what is not in any node is
    the call's overhead). Kept in the step's analysis, in place of an earlier profile of it."""
    parts = session.calls()
    if parts.device != "cpu":
        raise DcnbError("profiling times maps on the CPU; on a GPU its kernels need GPU events, not host timers")
    folder = pathlib.Path(tempfile.mkdtemp(prefix="profile_", dir=_profiles()))
    try:
        timed = [None if s is None else _instrumented(s, folder / side) for s, side in zip(parts.compiled, _SIDES)]
        runner = Runner(
            parts.imported, parts.program, timed[0].binary, None if timed[1] is None else timed[1].binary, "cpu"
        )
        calls = _calls_ms(parts.timed(runner), runs, parts.preserved)
        step = statistics.median(calls)
        kernels = []
        for side, built in zip(_SIDES, timed):
            if built is not None:
                # a node's share of the same calls' time: the shares of nodes inside a call sum to 1 or less,
                # where its median over the call's median could add up past 1 under load
                kernels += [
                    {"guid": guid, "name": name, "side": side, "ms": statistics.median(each),
                     "share": sum(each) / sum(calls)}
                    for guid, name, each in built.times(runs + 1)  # (and the warm-up)
                ]
        ops, eager = _torch_profile(parts.eager, runs, parts.preserved)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result = {
        "kernels": sorted(kernels, key=lambda k: -k["ms"]),
        "step_ms": step,
        "torch": [{**op, "share": op["ms"] / eager} for op in ops],
        "torch_ms": eager,
    }
    session.analysis().store(NAME, result)
    return result


def measured(session: Any, index: int | None = None) -> dict[str, Any] | None:
    """What ``run`` measured of good step ``index`` (the current one by default; None: not profiled)."""
    return session.analysis(index).known(NAME)


def table(session: Any, index: int | None = None) -> dict[str, Any] | None:
    """The profile of good step ``index`` (the current one by default) as the views show it, None where it was
    not profiled: its ``step``, the top kernels (``rows``), PyTorch eager's top ops (``eager``), ``step_ms`` and
    ``torch_ms``.

    A row is an op on a side, named as the graphs draw it (``graph.Named.op``): the kernels ``run`` timed of that
    op (an expansion's maps, reductions and BLAS calls) summed, their ``guids``, and the ``guid`` of the slowest,
    which the view shows when the row is clicked."""
    found = measured(session, index)
    if found is None:
        return None
    sdfgs = session.compiled_sdfgs(index)
    drawn = {guid: how for sdfg in sdfgs if sdfg is not None for guid, how in graph.named_by_guid(sdfg).items()}
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for kernel in found["kernels"]:  # (slowest first)
        op = drawn[kernel["guid"]].op if kernel["guid"] in drawn else names.readable(kernel["name"])
        row = rows.get((kernel["side"], op))
        if row is None:
            rows[kernel["side"], op] = dict(kernel, name=op, guids=[kernel["guid"]])
        else:
            row.update(ms=row["ms"] + kernel["ms"], share=row["share"] + kernel["share"])
            row["guids"].append(kernel["guid"])
    return {
        "step": session.current.index if index is None else index,
        "rows": sorted(rows.values(), key=lambda row: -row["ms"]),
        "eager": found["torch"],
        "step_ms": found["step_ms"],
        "torch_ms": found["torch_ms"],
    }


_SIDES = ("forward", "backward")
#: the nodes outside maps that get a timer; a tasklet there is often a library node an action already expanded
#: (fuse_rows and auto_optimize expand them: a matrix product's BLAS call is then a tasklet of its own)
_TIMED = (nodes.MapEntry, nodes.LibraryNode, nodes.NestedSDFG, nodes.Tasklet)


class _Instrumented:
    """An instrumented copy of a compiled SDFG, built and loaded; ``times`` finalizes it and reads its timers."""

    def __init__(
        self, sdfg: dace.SDFG, binary: CompiledSDFG, owners: dict[tuple[int, int, int], tuple[str, str]]
    ) -> None:
        self.sdfg = sdfg
        self.binary = binary
        #: a timer's place, DaCe's (region, state, node) ids as generated -> the drawn node (guid, label) it times
        self._owners = owners

    def times(self, calls: int) -> list[tuple[str, str, list[float]]]:
        """(guid, label, ms in each call) of each timed node over ``calls`` calls, the first (which loads and
        initializes) left out. A node's time in a call sums its timers' events then (a nested SDFG's states, a
        map in a loop): every call runs the same ones, in the same order."""
        self.binary.finalize()  # DaCe writes the report when the program exits
        report = self.sdfg.get_latest_report()
        if report is None:
            raise DcnbError(f"the instrumented {self.sdfg.name} wrote no report")
        per_call: dict[str, list[float]] = {}
        for uuid, by_name in report.durations.items():
            if uuid not in self._owners:
                continue
            values = [v for by_thread in by_name.values() for ms in by_thread.values() for v in ms]
            each = len(values) // calls
            totals = per_call.setdefault(self._owners[uuid][0], [0.0] * calls)
            for call in range(calls):
                totals[call] += sum(values[call * each : (call + 1) * each])
        labels = dict(self._owners.values())
        return [(guid, labels[guid], totals[1:]) for guid, totals in per_call.items()]


def _instrumented(sdfg: dace.SDFG, folder: pathlib.Path) -> _Instrumented:
    """Build a copy of compiled ``sdfg`` with timers on its top-level maps, tasklets, library nodes and nested SDFGs,
    in ``folder``, as its build did (its saved DaCe configuration and compiler flags).

    DaCe's CPU code generator times a map (its entry), a tasklet and a state, but neither a nested SDFG node nor
    a nested SDFG as a whole (its timer starts and never stops): a nested SDFG is timed by its states, and a
    library node is expanded here first, as code generation would, so that what it becomes can be timed so.
    Identical nested SDFGs, which code generation gives one function, get one each: a shared one would time
    every call as the first's."""
    timed = copy.deepcopy(sdfg)  # (node guids are kept)
    top = [
        (n, s)
        for n, s in timed.all_nodes_recursive()
        if isinstance(n, _TIMED) and _outermost(n, s, timed)
    ]
    labels = {n.guid: n.map.label if isinstance(n, nodes.MapEntry) else n.label for n, _ in top}
    timed.build_folder = str(folder)
    timed.fill_scope_connectors()
    with temporary_config(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Config.load(str(pathlib.Path(sdfg.build_folder) / "dace.conf"))
        Config.set("compiler", "unique_functions", value="none")
        # one report of every call, written when the program exits (one a call would be named by the millisecond)
        Config.set("instrumentation", "report_each_invocation", value=False)
        infer_types.infer_connector_types(timed)
        infer_types.set_default_schedule_and_storage_types(timed, None)
        with expansions(timed) as expanded:
            _expand_top_level(timed)
        for node, _ in top:
            node = expanded.get(node.guid, (node, None))[0]
            if isinstance(node, nodes.MapEntry):
                node.map.instrument = dace.InstrumentationType.Timer
            elif isinstance(node, nodes.NestedSDFG):
                for state in node.sdfg.states():
                    state.instrument = dace.InstrumentationType.Timer
            elif isinstance(node, nodes.Tasklet):
                node.instrument = dace.InstrumentationType.Timer
        _untimed_copies_in_maps(timed)
        objects = codegen.generate_code(timed, validate=False)
        compiler.generate_program_folder(timed, objects, str(folder))
        # the flags the step's build added for this SDFG (build.py decides them from the SDFG it compiles)
        flags = Config.get("compiler", "cpu", "args") + build._own_args(sdfg, "cpu")
        Config.set("compiler", "cpu", "args", value=flags)
        compiler.configure_and_compile(str(folder), timed.name)
        binary = compiler.load_precompiled_sdfg(str(folder), timed)
    # where each timer reports from (DaCe's ids, as generated): a map's or tasklet's node, a nested SDFG's own id
    guid_of = {id(node): guid for guid, (node, _) in expanded.items()}
    owners = {}
    for node, state in timed.all_nodes_recursive():
        if not isinstance(node, (nodes.MapEntry, nodes.Tasklet, nodes.NestedSDFG)):
            continue
        guid = guid_of.get(id(node), node.guid)
        if guid not in labels:
            continue
        if isinstance(node, nodes.NestedSDFG):
            for inner in node.sdfg.states():
                owners[(inner.parent_graph.cfg_id, inner.block_id, -1)] = (guid, labels[guid])
        else:
            owners[(state.parent_graph.cfg_id, state.block_id, state.node_id(node))] = (guid, labels[guid])
    return _Instrumented(timed, binary, owners)


def _untimed_copies_in_maps(sdfg: dace.SDFG) -> None:
    """Make code generation's copy nodes now, and take the timer off those inside maps.

    gap: DaCe's InsertExplicitCopies (code generation, under ``explicit_copy``) gives each copy the instrumentation
    of its state, a copy inside a map too: a timer per iteration, each reported under the report's lock (a
    LayerNorm backward's rows measured 360 ms instrumented, 1 ms as built). Run here first, it leaves nothing to
    code generation's own run."""
    if not Config.get_bool("compiler", "cpu", "explicit_copy"):
        return
    InsertExplicitCopies().apply_pass(sdfg, {})
    infer_types.infer_connector_types(sdfg)
    for node, state in sdfg.all_nodes_recursive():
        if isinstance(node, CopyLibraryNode) and state.entry_node(node) is not None:
            node.instrument = dace.InstrumentationType.No_Instrumentation


def _outermost(node: nodes.Node, state: dace.SDFGState, sdfg: dace.SDFG) -> bool:
    """Whether ``node`` is in one of ``sdfg``'s own states (not a nested SDFG's), outside every map."""
    return state.sdfg is sdfg and state.entry_node(node) is None


def _expand_top_level(sdfg: dace.SDFG) -> None:
    """Expand the library nodes outside maps in ``sdfg``'s own states until none is left there (an expansion may
    be another library node: dcnb's BLAS choice)."""
    while True:
        pending = [
            (n, s)
            for n, s in sdfg.all_nodes_recursive()
            if isinstance(n, nodes.LibraryNode) and _outermost(n, s, sdfg)
        ]
        if not pending:
            return
        for node, state in pending:
            node.expand(state)


def _profiles() -> pathlib.Path:
    """Where instrumented copies are built (and removed after): beside the build cache."""
    folder = cache.root() / "profile"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _calls_ms(call: Callable[[], None], runs: int, preserved: Callable) -> list[float]:
    """The milliseconds of each of ``runs`` calls after one warm-up, the user's module left as it was."""
    samples = []
    with preserved():
        call()
        for _ in range(runs):
            start = time.perf_counter()
            call()
            samples.append((time.perf_counter() - start) * 1000.0)
    return samples


def _torch_profile(call: Callable[[], None], runs: int, preserved: Callable) -> tuple[list[dict[str, Any]], float]:
    """PyTorch's profile (CPU) of ``runs`` calls after one warm-up: its top ops by their own time, in ms per call,
    and the median call in ms."""
    samples = []
    with preserved():
        call()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            for _ in range(runs):
                start = time.perf_counter()
                call()
                samples.append((time.perf_counter() - start) * 1000.0)
    ops = [(e.key, e.self_cpu_time_total / runs / 1000.0) for e in profiler.key_averages()]
    ops = sorted((op for op in ops if op[1] > 0), key=lambda op: -op[1])[:TOP_OPS]
    return [{"name": name, "ms": ms} for name, ms in ops], statistics.median(samples)
