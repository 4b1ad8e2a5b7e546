"""Work in forked processes that can be stopped whole: each child leads a process group of its own, so that a
stop kills it with everything it started (cmake, ninja, the compiler), and dies with the thread that forked it.
Nothing here knows what the work is: ``build`` compiles through it, ``cuda_check`` runs the background CUDA build.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import pickle
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import NoReturn

from .errors import describe


class Lost(RuntimeError):
    """A child that ended without sending its result back (killed, or crashed)."""


def put_first_on_path(folder: str) -> None:
    """Builders run the tools they find on PATH: DaCe's CUDA build needs a newer ``cmake`` than Debian 12's (the
    wheel's), PyTorch's extension builder a ``ninja`` (the wheel's, where the system has none)."""
    paths = os.environ.get("PATH", "").split(os.pathsep)
    if paths[0] != folder:
        os.environ["PATH"] = os.pathsep.join([folder, *(p for p in paths if p != folder)])



@contextlib.contextmanager
def interrupts_deferred():
    """Hold back an interrupt (SIGINT, Ctrl-C) that comes during the block and deliver it at its end; on the main
    thread only, the one Python delivers signals to."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    previous = signal.signal(signal.SIGINT, lambda *_: held.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            signal.raise_signal(signal.SIGINT)  # now handled as it would have been (KeyboardInterrupt, by default)


class Child:
    """``fn(*args)`` in a forked process leading a process group of its own, so that it and every process it
    starts (cmake, ninja, the compiler) are killed together. Its result or exception comes back pickled."""

    def __init__(self, fn: Callable, *args):
        # a file, not a pipe: a long compiler log cannot block the child (closed in reap)
        self._outcome = tempfile.TemporaryFile()  # noqa: SIM115
        self._stage = tempfile.TemporaryFile()  # noqa: SIM115
        self.status: int | None = None
        parent = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:
            _child(parent, self._outcome, self._stage, fn, args)
        with contextlib.suppress(OSError):
            os.setpgid(self.pid, self.pid)  # here too, as shells do: a kill right after the fork finds the group

    def done(self) -> bool:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status
        return self.status is not None

    def result(self) -> object:
        self._outcome.seek(0)
        data = self._outcome.read()
        if not data:
            ended = f"signal {os.WTERMSIG(self.status)}" if os.WIFSIGNALED(self.status) else "no result"
            raise Lost(f"ended without a result ({ended})")
        kind, value = pickle.loads(data)
        if kind == "error":
            raise value
        return value

    def waited(self) -> object:
        """``result`` once the process has ended, waiting for it (an interrupt meanwhile is raised here)."""
        if self.status is None:
            _, self.status = os.waitpid(self.pid, 0)
        return self.result()

    def stage(self) -> str:
        """What the process said it was doing last (``entering``), empty if nothing."""
        self._stage.seek(0)
        return self._stage.read().decode()

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def pause(self) -> None:
        """Stop the process and every process it started (the compiler) until ``resume``."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, number: int) -> None:
        """Signal the process's group and every process below it: a process it forked (a build's compile) is in a
        group of its own, which a signal to this group alone misses (a compile forked as the group was stopped was
        left stopped for good, its build waiting on it)."""
        if self.status is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, number)
            signal_tree(self.pid, number)

    def reap(self) -> None:
        if self.status is None:
            _, self.status = os.waitpid(self.pid, 0)
        self._outcome.close()
        self._stage.close()

    def stop(self) -> None:
        stop_all([self])


def stop_all(children: Iterable[Child]) -> None:
    """Each child killed, then each reaped, an interrupt meanwhile held back: a second Ctrl-C while stopping them
    must not leave one running, or unreaped."""
    children = list(children)
    with interrupts_deferred():
        for child in children:
            child.kill()
        for child in children:
            child.reap()


def _die_with_parent(parent: int) -> None:
    """Have Linux signal this process when the thread that forked it ends, and stop the whole process group then: a
    Python killed outright (a kernel restarted) leaves no compile running on."""
    with contextlib.suppress(Exception):
        signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent ended before the call
            os.killpg(0, signal.SIGKILL)


#: in a forked process: the file in which ``entering`` says what it is doing (its parent names it if it is late)
_stage_file = None


def entering(stage: str) -> None:
    if _stage_file is not None:
        _stage_file.seek(0)
        _stage_file.truncate()
        _stage_file.write(stage.encode())
        _stage_file.flush()


def _child(parent: int, outcome, stage, fn: Callable, args: tuple) -> NoReturn:
    """The forked process: run ``fn``, write ``("ok", result)`` or ``("error", exception)`` and exit, never
    returning into the caller's code."""
    global _stage_file
    _stage_file = stage
    try:
        os.setpgid(0, 0)
        _die_with_parent(parent)
        try:
            result = ("ok", fn(*args))
        except BaseException as e:  # noqa: BLE001 -- every outcome goes back to the parent
            result = ("error", e)
        try:
            data = pickle.dumps(result)
        except Exception as e:  # noqa: BLE001 -- an exception that does not pickle comes back as its description
            data = pickle.dumps(("error", RuntimeError(describe(result[1] if result[0] == "error" else e))))
        outcome.write(data)
        outcome.flush()
    finally:
        os._exit(0)


def signal_tree(root: int, number: int) -> None:
    """Signal ``root`` and every process below it (one that has ended meanwhile is passed over). A stop returns once
    each has stopped (it takes effect as the process is next scheduled), or after a second; a process forked just
    before its parent stopped is found on the next look and stopped too."""
    signalled: set[int] = set()
    deadline = time.monotonic() + 1
    while True:
        pids = [p for p in [root, *_descendants(root)] if p not in signalled]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, number)
        signalled.update(pids)
        if number != signal.SIGSTOP or not pids:
            return
        while time.monotonic() < deadline and any(_running(pid) for pid in signalled):
            time.sleep(0.002)
        if time.monotonic() >= deadline:
            return


def _running(pid: int) -> bool:
    """Whether the process is there and not stopped (nor a zombie)."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "TtZX"
    except (OSError, IndexError):
        return False


def _descendants(root: int) -> list[int]:
    """The processes below ``root``, as /proc has them now (none where there is no /proc)."""
    children: dict[int, list[int]] = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # a process that ended meanwhile
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, pending = [], [root]
    while pending:
        below = children.get(pending.pop(), [])
        found.extend(below)
        pending.extend(below)
    return found
