"""The CUDA build each CPU step also makes in the background where nvcc is present: a recipe that does not build for
CUDA shows up before anyone rents a GPU, and the CPU result does not wait for it.

DaCe's code generation is not thread-safe and changes its global configuration, so each build runs in a process of
its own (forked.Child, leading its process group). It is forked when its step is made, on the thread
that applies steps (forking while that thread is inside DaCe could copy a lock it holds), and then waits on a pipe
until a thread of the session gives it its turn: one build at a time, at a lower priority, so that queued builds do
not crowd the cores the steps are compiled and timed on, and none runs while a step is timed (``alone.timing``): a
BERT-base layer's timings were taken with earlier steps' builds competing for the cores. It goes through
``build.build(..., "cuda")`` as a step on a GPU does, so it is cached by content, the architecture in the key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

import dace
import torch

from . import build as builder
from . import alone, forked
from .errors import CompileError, DcnbError, InputError, describe, first_line

#: the architectures one names (Ampere, its consumer parts, Ada, Hopper), as the numbers DaCe's CMake build takes
ARCHES = ("80", "86", "89", "90")
#: what a CUDA build targets unless a GPU here or the user says otherwise: the H100
DEFAULT_ARCH = "90"

PENDING, OK, FAILED, SKIPPED, CANCELLED = "pending", "ok", "failed", "skipped", "cancelled"

#: what a build builds: the forward and backward SDFGs, or a function making them
Sides = list[dace.SDFG | None] | Callable[[], list[dace.SDFG | None]]


def arch(value: str, option: str = "cuda_arch") -> str:
    """``sm_80`` or ``80`` as the number DaCe's CUDA build takes; an InputError names any other value."""
    number = str(value).strip().lower().removeprefix("sm_")
    if number not in ARCHES:
        names = ", ".join(f"sm_{a}" for a in ARCHES)
        raise InputError(f"{option} {value!r} is not a CUDA architecture dcnb builds for; choose from {names}")
    return number


def default_arch() -> str:
    """The GPU's own architecture where there is one, else sm_90."""
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}{minor}"
    return DEFAULT_ARCH


def enabled(requested: bool | None) -> bool:
    """Whether CPU steps also build for CUDA: as asked, else unless ``DCNB_CUDA_BUILD`` is 0 (the test suite)."""
    if requested is not None:
        return requested
    return os.environ.get("DCNB_CUDA_BUILD", "").strip() != "0"


def nvcc_present() -> bool:
    """Whether CMake would find nvcc: on PATH, under $CUDA_HOME or in CUDA's default prefix, where it looks."""
    homes = (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda")
    return shutil.which("nvcc") is not None or any(h and os.path.exists(os.path.join(h, "bin", "nvcc")) for h in homes)


class CudaBuild:
    """One step's CUDA build: pending until its process ends, then ok (with its seconds) or failed (with the reason
    and the compiler's log); skipped where there is no nvcc. It changes as the build goes on: read it again."""

    def __init__(self, arch: str, state: str = PENDING, reason: str | None = None):
        self.arch = arch
        self.state = state
        #: seconds generating and compiling (0.0: it came from the cache)
        self.seconds: float | None = None
        self.reason = reason
        #: the compiler's output (or the whole error) where it failed
        self.log: str | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._callbacks: list[Callable[[CudaBuild], None]] = []
        #: stops the build (Builds.start sets it)
        self._stop: Callable[[], None] | None = None
        if state != PENDING:
            self._done.set()

    @property
    def text(self) -> str:
        """One line, as every view shows it."""
        if self.state == SKIPPED:
            return f"CUDA build: skipped ({self.reason})"
        if self.state == PENDING:
            return f"CUDA build: pending (sm_{self.arch}, in the background)"
        if self.state == OK:
            took = "cached" if not self.seconds else f"{self.seconds:.1f} s"
            return f"CUDA build: ok (sm_{self.arch}, {took})"
        if self.state == CANCELLED:
            return f"CUDA build: cancelled (sm_{self.arch})"
        return f"CUDA build: failed (sm_{self.arch}): {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "arch": f"sm_{self.arch}",
            "seconds": self.seconds,
            "reason": self.reason,
            "log": self.log,
            "text": self.text,
        }

    def cancel(self) -> None:
        """Stop the build, running or queued, with its compilers (nothing where it has ended)."""
        if self._stop is not None and not self._done.is_set():
            self._stop()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the build has ended (or ``timeout`` seconds); whether it has."""
        return self._done.wait(timeout)

    def on_done(self, callback: Callable[[CudaBuild], None]) -> None:
        """Call ``callback(self)`` once the build has ended (now, where it has), on the thread that ends it."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def _end(self, state: str, seconds: float | None = None, reason: str | None = None, log: str | None = None) -> None:
        with self._lock:
            self.state, self.seconds, self.reason, self.log = state, seconds, reason, log
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            # a view that has gone away must not stop the builds queued behind this one
            with contextlib.suppress(Exception):
                callback(self)

    def __repr__(self) -> str:
        return f"<{self.text}>"


@dataclasses.dataclass(frozen=True)
class _Job:
    child: forked.Child
    #: the pipe's end that gives the child its turn
    go: int
    status: CudaBuild


class Builds:
    """A session's CUDA builds for one architecture, run in order by a thread of their own; ``close`` stops them
    (the session does on being collected and at exit)."""

    def __init__(self, arch: str):
        self.arch = arch
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._jobs: list[_Job] = []
        #: the builds cancel() stopped
        self._cancelled: set[CudaBuild] = set()
        # the thread waits on children while close kills them: a child reaped in between must not be signalled
        self._lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None
        #: the build given its turn and not yet ended, and since when it is paused (None: running)
        self._running: _Job | None = None
        self._paused_at: float | None = None
        self._paused_for = 0.0
        alone.register(self)

    def _pause(self) -> None:
        with self._lock:
            if self._running is not None and self._paused_at is None:
                self._running.child.pause()
                self._paused_at = time.monotonic()

    def _resume(self) -> None:
        with self._lock:
            if self._paused_at is not None:
                self._paused_for += time.monotonic() - self._paused_at
                self._paused_at = None
                if self._running is not None:
                    self._running.child.resume()

    def start(self, sdfgs: Sides) -> CudaBuild:
        """Queue a CUDA build of ``sdfgs`` (as they are before the build passes; or the function that makes them, in
        the build's process); call on the thread running DaCe."""
        if not nvcc_present():
            return CudaBuild(self.arch, SKIPPED, "no nvcc")
        status = CudaBuild(self.arch)
        wait, go = os.pipe()
        try:
            child = forked.Child(_build, wait, go, sdfgs, self.arch)
        except OSError as e:  # no process to be had: the step stands all the same
            os.close(go)
            return CudaBuild(self.arch, FAILED, f"could not start its process: {e}")
        except BaseException:
            os.close(go)
            raise
        finally:
            os.close(wait)
        job = _Job(child, go, status)
        status._stop = lambda: self._cancel(job)
        with self._lock:
            self._jobs = [j for j in self._jobs if j.child.status is None] + [job]
        self._queue.put(job)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="dcnb CUDA builds", daemon=True)
            self._thread.start()
        return status

    def close(self) -> None:
        """Stop every build, running or queued; the thread reaps them and marks them failed."""
        with self._lock:
            self._closed = True
            for job in self._jobs:
                job.child.kill()
        self._queue.put(None)

    def _cancel(self, job: _Job) -> None:
        with self._lock:
            self._cancelled.add(job.status)
            job.child.kill()
            queued = job is not self._running
        if queued:  # it ends now, not when its turn comes (then it is passed over)
            job.status._end(CANCELLED)

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                self._one(job)
            finally:
                os.close(job.go)
                with self._lock:
                    job.child.stop()  # (where it ended, a reap)

    def _one(self, job: _Job) -> None:
        try:
            limit = builder.compile_timeout()
            while not alone.UNTIMED.wait(0.1) and not self._closed:
                pass  # a step is being timed: this build waits for its turn until it is done
            with self._lock:
                if job.status in self._cancelled:
                    return
                os.write(job.go, b"g")
                self._running, self._paused_for = job, 0.0
                if not alone.UNTIMED.is_set():  # a timing began just now: paused from its start
                    job.child.pause()
                    self._paused_at = time.monotonic()
        except (DcnbError, OSError) as e:  # a bad DCNB_COMPILE_TIMEOUT; a child stopped already
            job.status._end(FAILED, reason="stopped with its session" if self._closed else first_line(e))
            return
        try:
            self._await(job, time.monotonic() + limit, limit)
        finally:
            with self._lock:
                self._running, self._paused_at = None, None

    def _await(self, job: _Job, deadline: float, limit: float) -> None:
        while True:
            with self._lock:
                if job.child.done():
                    break
                paused = self._paused_for + (0.0 if self._paused_at is None else time.monotonic() - self._paused_at)
                if time.monotonic() > deadline + paused:
                    job.child.kill()
                    job.status._end(
                        FAILED,
                        reason=f"timed out after {limit:g} s and was stopped; DCNB_COMPILE_TIMEOUT sets the limit in seconds",
                    )
                    return
            time.sleep(0.1)
        if job.status in self._cancelled:
            job.status._end(CANCELLED)
            return
        if self._closed:
            job.status._end(FAILED, reason="stopped with its session")
            return
        try:
            seconds = job.child.result()
        except CompileError as e:
            job.status._end(FAILED, reason=first_line(e), log=e.log or None)
        except forked.Lost as e:
            job.status._end(FAILED, reason=f"the compile process {e}")
        except Exception as e:  # noqa: BLE001 -- every failure of the build is its outcome, never the thread's end
            text = str(e)
            job.status._end(FAILED, reason=first_line(describe(e)), log=text if "\n" in text.strip() else None)
        else:
            job.status._end(OK, seconds=float(seconds))


def _build(wait: int, go: int, sdfgs: Sides, arch: str) -> float:
    """In the forked process: wait for this build's turn, then build for CUDA; the seconds it took."""
    os.close(go)  # the parent's end: with it closed here, a parent gone leaves the read below at its end
    if os.read(wait, 1) != b"g":
        raise CompileError("stopped before its turn")
    os.nice(10)  # behind the steps the session compiles and times
    return builder.build(sdfgs() if callable(sdfgs) else sdfgs, "cuda", cuda_arch=arch).seconds
