"""Faults, each injected on real builds: an interrupt, a corrupted cache, two processes building the same key, a
cache that cannot be written, a compiler that hangs, a C++ call path that does not build. Each leaves the session at
its last good state, and the next step works."""

import errno
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from dace.codegen import compiler
from dace.config import Config, temporary_config

import dcnb
from dcnb._src import build, cache, events, forked, program, timing, verify
from dcnb._src import session as session_module
from dcnb._src.errors import CacheError
from tests import processes
from tests.models import Mish

pytestmark = pytest.mark.compile

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def isolated(fresh_cache, monkeypatch):
    """A cache of its own, and no binary loaded before in this process: every step here compiles."""
    monkeypatch.setattr(build, "_loaded", {})
    return fresh_cache


def _session(*shape: int) -> dcnb.Session:
    torch.manual_seed(0)
    return dcnb.optimize(Mish(), torch.rand(*shape), baselines=(), time_budget=0.01)


def _state(session: dcnb.Session) -> tuple:
    """What a fault must not change: the current step, the recipe and the SDFGs."""
    return (
        session.current.index,
        json.dumps(session.recipe),
        session.pre_autodiff_sdfg.hash_sdfg(),
        session.forward_sdfg.hash_sdfg(),
        session.backward_sdfg.hash_sdfg(),
    )


def _script(path: pathlib.Path, body: str) -> pathlib.Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def _hanging_compiler(tmp_path: pathlib.Path, before: str = "") -> pathlib.Path:
    """A C++ compiler that never finishes: it records its pid, then sleeps a minute."""
    return _script(tmp_path / "hanging-c++", f'echo $$ >> "{tmp_path}/pids"\n{before}\nexec sleep 60')


def _running(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _in_group(pgid: int) -> list[int]:
    """The live processes in process group ``pgid``."""
    return processes.live(processes.PGRP, pgid)


@pytest.fixture
def children(monkeypatch):
    """The pids of the processes that builds fork (each leads its process group)."""
    pids = []

    class Recorded(forked.Child):
        def __init__(self, *args):
            super().__init__(*args)
            pids.append(self.pid)

    monkeypatch.setattr(forked, "Child", Recorded)
    return pids


def _nothing_left_running(tmp_path: pathlib.Path, children: list[int]) -> None:
    compilers = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert compilers and children
    assert not [p for p in compilers if _running(p)]
    assert not [p for pgid in children for p in _in_group(pgid)]


# --- 1. interrupts ----------------------------------------------------------------------------------------------


class InterruptedExport(Mish):
    """Mish, whose forward is interrupted (as by Ctrl-C) while the ONNX exporter traces it, the first time only."""

    interrupt = True  # on the class: dcnb may export a copy of the module

    def forward(self, x):
        if torch.onnx.is_in_onnx_export() and InterruptedExport.interrupt:
            InterruptedExport.interrupt = False
            raise KeyboardInterrupt
        return super().forward(x)


def test_an_interrupt_during_export_raises_keyboard_interrupt_and_the_module_exports_again(isolated):
    module, InterruptedExport.interrupt = InterruptedExport(), True
    x = torch.rand(2, 3, 4, 4)
    with pytest.raises(KeyboardInterrupt) as interrupted:
        dcnb.optimize(module, x, baselines=(), time_budget=0.01)
    assert interrupted.value.__context__ is None  # raised as it came, not wrapped in or chained to a dcnb error
    assert not torch.onnx.is_in_onnx_export() and not InterruptedExport.interrupt
    session = dcnb.optimize(module, x, baselines=(), time_budget=0.01)
    assert session.current.ok


def test_an_interrupt_during_the_compiles_stops_them_and_the_next_step_builds_afresh(
    isolated, tmp_path, children, monkeypatch
):
    session = _session(2, 3, 4, 5)
    before, history = _state(session), session.history
    children.clear()
    monkeypatch.setenv("DCNB_COMPILE_TIMEOUT", "30")  # should the interrupt not come, the test still ends
    # the compiler itself interrupts this process (as Ctrl-C would) while both compiles run; the header is left out,
    # so that the first compiler to run is a compile's
    interrupt = f'mkdir "{tmp_path}/interrupted" 2>/dev/null && kill -INT {os.getpid()}'
    hanging = _hanging_compiler(tmp_path, before=interrupt)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt), temporary_config():
        Config.set("compiler", "cpu", "executable", value=str(hanging))
        Config.set("compiler", "precompiled_header", value=False)
        session.apply("tasklet_fusion")
    assert time.monotonic() - start < 20  # not the compiler's minute
    assert len(children) == 2  # the forward's and the backward's, each generating its code and compiling it
    _nothing_left_running(tmp_path, children)
    # the step is recorded as cancelled, the session stays as it was
    assert _state(session) == before and session.history[:-1] == history
    assert session.history[-1].error.startswith("cancelled while compiling after")
    builds = [d for d in (isolated / "builds").iterdir() if d.is_dir()]
    stopped = [d for d in builds if not (d / cache.CHECKSUMS).exists()]
    # the folders the step was writing, not marked finished: the compiling one's, and the other's where its
    # code was generated by then
    assert 1 <= len(stopped) <= 2
    with events.count() as counted:
        step = session.apply("tasklet_fusion")
    assert step.ok and step.index == 2 and counted["build"] == 2  # the forward and the backward, each once
    assert all((d / cache.CHECKSUMS).exists() for d in stopped)


#: each phase of a step before and after its compiles -> the function it runs in and how the cancelled step names
#: the phase
PHASES = {
    "transformation": (session_module, "_run", "applying tasklet_fusion"),
    "autodiff": (program, "differentiate", "generating the backward pass"),
    "check": (verify, "compare", "checking against PyTorch"),
    "timing": (timing, "interleaved", "timing"),
}


@pytest.mark.parametrize("stage", list(PHASES))
def test_an_interrupt_in_any_phase_but_the_compiles_leaves_the_session_at_its_last_good_state(
    isolated, monkeypatch, stage
):
    session = _session(2, 3, 4, 6)
    before, history = _state(session), session.history
    owner, name, phase = PHASES[stage]
    real = getattr(owner, name)

    def interrupted(*args, **kwargs):
        monkeypatch.setattr(owner, name, real)  # once
        if stage == "timing":
            for call in args[0].values():
                call()  # the compiled module has run forward and backward when the interrupt comes
        raise KeyboardInterrupt

    monkeypatch.setattr(owner, name, interrupted)
    with pytest.raises(KeyboardInterrupt):
        session.apply("tasklet_fusion")
    assert getattr(owner, name) is real
    assert _state(session) == before and session.history[:-1] == history
    assert session.history[-1].error.startswith(f"cancelled while {phase}")
    step = session.apply("tasklet_fusion")
    assert step.ok and step.index == 2 and _state(session) != before


# --- 2. a corrupted cache -----------------------------------------------------------------------------------------

_BUILD_MISH = """
import torch, dcnb
from tests.models import Mish
assert dcnb.optimize(Mish(), torch.rand({shape}), baselines=(), time_budget=0.01).current.ok
"""


def test_a_truncated_or_corrupted_binary_in_the_cache_is_built_again_and_never_loaded(isolated, monkeypatch):
    shape = "3, 2, 4, 4"
    # built by another process: this one must not have the libraries mapped while they are damaged
    subprocess.run([sys.executable, "-c", _BUILD_MISH.format(shape=shape)], check=True, cwd=ROOT)
    libraries = sorted(isolated.glob("builds/*/build/libMish_*.so"))
    forward, backward = (next(p for p in libraries if ("_backward_" in p.name) is b) for b in (False, True))
    size = forward.stat().st_size
    forward.write_bytes(forward.read_bytes()[: size // 2])  # truncated
    data = bytearray(backward.read_bytes())
    middle = slice(len(data) // 2, len(data) // 2 + 64)
    data[middle] = bytes(b ^ 0xFF for b in data[middle])  # corrupted, the same size (zeros there changed nothing)
    backward.write_bytes(bytes(data))
    loaded = []
    load = compiler.load_precompiled_sdfg

    def checked_load(folder, sdfg):
        loaded.append(cache.intact(pathlib.Path(folder), compiler.get_binary_name(folder, sdfg.name)))
        return load(folder, sdfg)

    monkeypatch.setattr(compiler, "load_precompiled_sdfg", checked_load)
    with events.count() as counted:
        session = dcnb.optimize(Mish(), torch.rand(3, 2, 4, 4), baselines=(), time_budget=0.01)
    assert session.current.ok and counted["build"] == 2
    assert loaded == [True, True] and forward.stat().st_size == size

    # a build stopped before it was marked finished (no checksum file) is built again too, and only it
    (forward.parents[1] / cache.CHECKSUMS).unlink()
    kept = backward.stat().st_mtime_ns
    monkeypatch.setattr(build, "_loaded", {})
    with events.count() as counted:
        session = dcnb.optimize(Mish(), torch.rand(3, 2, 4, 4), baselines=(), time_budget=0.01)
    assert session.current.ok and counted["build"] == 1 and session.current.compile_seconds > 0
    assert (forward.parents[1] / cache.CHECKSUMS).exists() and backward.stat().st_mtime_ns == kept


# --- 3. two processes, one key ------------------------------------------------------------------------------------

_RACE = """
import os, sys, time, torch, dcnb
from dcnb._src import build, events
from tests.models import Mish
generate = build._generate
def slow_generate(*args):  # a build that takes long enough for the other process to want the same key meanwhile
    time.sleep(3)
    return generate(*args)
build._generate = slow_generate
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.005)
with events.count() as counted:
    session = dcnb.optimize(Mish(), torch.rand(2, 2, 4, 5), baselines=(), time_budget=0.01)
print(counted["build"], session.current.ok)
"""


def test_two_processes_building_the_same_key_build_it_once(isolated, tmp_path):
    go = tmp_path / "go"
    racers = [
        subprocess.Popen([sys.executable, "-c", _RACE, str(go)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for racer in racers:
        assert racer.stdout.readline().strip() == "ready"
    go.touch()  # both start at once, from warm imports
    results = [racer.communicate(timeout=300)[0].split() for racer in racers]
    assert all(racer.returncode == 0 for racer in racers)
    assert [ok for _, ok in results] == ["True", "True"]
    assert sum(int(built) for built, _ in results) == 2  # the forward and the backward, each by one of them
    assert len(list(isolated.glob(f"builds/*/{cache.CHECKSUMS}"))) == 2


# --- 4. a cache that cannot be written ----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["under /proc", "under a file"])
def test_a_cache_that_cannot_be_created_gets_a_message_naming_it(tmp_path, monkeypatch, where):
    # as root, a read-only mode does not stop writes: these paths cannot be created at all
    (tmp_path / "a-file").write_text("")
    root = pathlib.Path("/proc/dcnb-cache") if where == "under /proc" else tmp_path / "a-file" / "cache"
    monkeypatch.setenv("DCNB_CACHE", str(root))
    monkeypatch.setattr(build, "_loaded", {})
    with pytest.raises(CacheError) as error:
        _session(2, 3, 4, 4)
    message = str(error.value)
    assert str(root) in message and "DCNB_CACHE" in message, message


@pytest.mark.parametrize("where", ["writing the code", "compiling"])
def test_a_full_cache_fails_the_step_with_a_message_naming_it(isolated, monkeypatch, where):
    session = _session(2, 3, 4, 7)
    before = _state(session)
    owner, name = (compiler, "generate_program_folder" if where == "writing the code" else "configure_and_compile")
    real = getattr(compiler, name)

    def full(*args, **kwargs):
        # what writing into a full disk raises; the compile runs in a child process, which inherits this
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(isolated / "builds" / "Mish" / "src" / "x.cpp"))

    monkeypatch.setattr(owner, name, full)
    step = session.apply("tasklet_fusion")
    assert not step.ok and "No space left on device" in step.error, step.error
    assert str(isolated) in step.error and "DCNB_CACHE" in step.error, step.error
    assert _state(session) == before
    monkeypatch.setattr(owner, name, real)
    assert session.apply("tasklet_fusion").ok


# --- 5. a compiler that hangs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["header", "compiles"])
def test_a_compile_that_hangs_is_stopped_after_the_limit(isolated, tmp_path, monkeypatch, children, stage):
    session = _session(2, 3, 5, 4)
    before = _state(session)
    children.clear()
    monkeypatch.setenv("DCNB_COMPILE_TIMEOUT", "2")
    start = time.monotonic()
    with temporary_config():
        Config.set("compiler", "cpu", "executable", value=str(_hanging_compiler(tmp_path)))
        Config.set("compiler", "precompiled_header", value=stage == "header")  # where the compiler first runs
        step = session.apply("tasklet_fusion")
    took = time.monotonic() - start
    assert not step.ok and "timed out after 2 s" in step.error, step.error
    assert ("precompiled header" in step.error) is (stage == "header")
    assert took < 15, took
    _nothing_left_running(tmp_path, children)
    assert _state(session) == before and not session.history[-1].ok
    monkeypatch.delenv("DCNB_COMPILE_TIMEOUT")  # a real compile may take longer than 2 s here
    step = session.apply("tasklet_fusion")
    assert step.ok and _state(session) != before


# --- 6. the forward's transformation fails in its process ---------------------------------------------------------


@pytest.mark.parametrize("how", ["raises", "dies", "interrupted"])
@pytest.mark.parametrize("step", [pytest.param("map_fusion", marks=pytest.mark.deep), "tasklet_fusion"])
def test_a_forward_transformation_that_fails_in_its_process_leaves_the_session_as_it_was(
    isolated, monkeypatch, children, step, how
):
    # an action after autodiff transforms the forward in a forked process while this one transforms the backward;
    # one before autodiff (tasklet_fusion) makes the backward again, and the steps after autodiff are applied again
    # to both sides the same way
    session = _session(2, 3, 5, 5)
    if step == "tasklet_fusion":
        assert session.apply("map_fusion").ok
    before, history, here = _state(session), session.history, os.getpid()
    children.clear()
    run = session_module._run

    def failing(action, sdfg, *args, **kwargs):
        if os.getpid() != here:  # the forked process, transforming the forward
            if how == "dies":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "interrupted":
                time.sleep(60)  # still at work when the interrupt comes
            raise ValueError("the forward's transformation broke")
        if how == "interrupted" and "backward" in sdfg.name:
            raise KeyboardInterrupt  # while the backward is transformed (Cancel, Ctrl-C)
        return run(action, sdfg, *args, **kwargs)

    monkeypatch.setattr(session_module, "_run", failing)
    start = time.monotonic()
    if how == "interrupted":
        with pytest.raises(KeyboardInterrupt):
            session.apply(step)
        assert session.history[-1].error.startswith("cancelled while applying map_fusion")
    else:
        made = session.apply(step)
        said = {
            "raises": f"{step} raised ValueError: the forward's transformation broke",
            "dies": f"{'map_fusion' if step == 'map_fusion' else 'map_fusion applied again'} on the forward: its "
            "process ended without a result (signal 9)",
        }
        assert not made.ok and made.error == said[how], made.error
    assert time.monotonic() - start < 30  # not the forked process's minute
    # the forward's process, and unless the interrupt came first the backward's compile: stopped with the step
    assert len(children) == (1 if how == "interrupted" else 2)
    assert not [p for pgid in children for p in _in_group(pgid)]
    assert _state(session) == before and session.history[:-1] == history
    monkeypatch.setattr(session_module, "_run", run)
    assert session.apply(step).ok


# --- 7. no C++ call path ------------------------------------------------------------------------------------------

_NATIVE = """
import json, warnings, torch, dcnb
from tests.models import Mish
x = torch.rand(2, 3, 4, 4)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    sessions = [dcnb.optimize(Mish(), x, baselines=(), time_budget=0.01) for _ in range(2)]
    xr = x.clone().requires_grad_()
    y = sessions[1].module(xr)
    y.backward(torch.ones_like(y))
want = x.clone().requires_grad_()
expected = Mish()(want)
expected.backward(torch.ones_like(expected))
print(json.dumps({
    "said": [str(w.message) for w in caught if "C++ call path" in str(w.message)],
    "python": all(s._states[-1].runner._plan is None for s in sessions),
    "ok": all(s.current.ok for s in sessions) and torch.allclose(y, expected) and torch.allclose(xr.grad, want.grad),
}))
"""


def test_a_cpp_call_path_that_does_not_build_falls_back_to_python_and_says_so_once(tmp_path):
    # in a process of its own, with an empty extension folder: this one has the extension loaded already
    failing = _script(tmp_path / "failing-c++", f'echo "$@" >> "{tmp_path}/called"\necho "error: no" >&2\nexit 1')
    env = dict(
        os.environ,
        TORCH_EXTENSIONS_DIR=str(tmp_path / "extensions"),
        CXX=str(failing),  # PyTorch's extension builder compiles with $CXX
        DACE_compiler_cpu_executable=shutil.which("c++") or "c++",  # DaCe would take $CXX too; not here
        DCNB_NATIVE="1",
    )
    _falls_back_to_python(env, timeout=300)
    assert (tmp_path / "called").exists()  # the failure is the compiler's


def _falls_back_to_python(env: dict[str, str], timeout: float) -> None:
    """Two sessions in a process of their own, with ``env``: the call path did not build, which it says once, and
    both call their binaries from Python, with PyTorch's results."""
    done = subprocess.run(
        [sys.executable, "-c", _NATIVE], check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["said"]) == 1 and "called from Python" in result["said"][0], result["said"]
    assert result["python"] and result["ok"]


def test_a_cpp_call_path_build_killed_midway_is_built_again_not_waited_on(tmp_path):
    # a kernel restarted while the call path built left PyTorch's lock file behind, and every later process waited on
    # it for ever (a suite run hung on its first test)
    extensions, started = tmp_path / "extensions", tmp_path / "started"
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(extensions), DCNB_NATIVE="1")
    # (PyTorch asks the compiler its version first: that one answers)
    compiles = f'case " $* " in *" -c "*) touch "{started}"; exec sleep 120;; esac\nexec c++ "$@"'
    env["CXX"] = str(_script(tmp_path / "slow-c++", compiles))
    killed = subprocess.Popen(
        [sys.executable, "-c", "from dcnb._src import native; native.extension()"],
        cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not started.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert started.exists(), "the first build never reached its compiler"
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    assert list(extensions.glob("**/lock")), "the killed build left no lock file: nothing to test"
    # the next process builds (here with a compiler that fails at once: its fallback says so) instead of waiting
    env["CXX"] = str(_script(tmp_path / "failing-c++", 'echo "error: no" >&2\nexit 1'))
    env["DACE_compiler_cpu_executable"] = shutil.which("c++") or "c++"
    _falls_back_to_python(env, timeout=180)
