"""A search's compiles on a Dask cluster (``pip install dcnb[cluster]``): the code of each SDFG is generated here, in a
process of its own (DaCe and the ONNX model's constants are here), the sources are compiled on a worker, and the
libraries come back into this machine's build cache, which then loads, checks and times every candidate, so that
the times compare with each other and with the model's machine.

Why Dask and not Ray: both run a search's compiles (seconds each, a few a minute) with time to spare, but a local
Dask cluster of 2 workers starts in 1.7 s against Ray's 15 s, takes 216 MiB against Ray's 1.1 GiB, installs 45 MB
against Ray's 260 MB, and a Dask client reaches a cluster someone runs already by its address (benchmarks/NOTES.md,
A search on a cluster).

The workers run the same image as this machine (dcnb, DaCe, PyTorch and the compiler at the same paths): the
generated build files name this machine's DaCe and PyTorch headers and libraries. ``-march=native`` is compiled as
this machine's CPU (the flags GCC derives for it here), so that a worker of another CPU builds what runs here.
"""

from __future__ import annotations

import functools
import io
import os
import pathlib
import shlex
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import dace
from dace.config import Config

from . import build as builder
from . import alone, cache, forked
from .errors import CompileError, DcnbError
from .names import readable_sdfg


def client(cluster: Any):
    """A Dask client from what ``Session.search`` was given: a client, or a scheduler's address."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise DcnbError(
            "a search on a cluster needs Dask's distributed scheduler: pip install 'dcnb[cluster]'"
        ) from None
    if isinstance(cluster, Client):
        return cluster
    if isinstance(cluster, str):
        try:
            return Client(cluster, timeout="5s")
        except OSError as e:
            raise DcnbError(f"no Dask scheduler answers at {cluster!r}: {e}") from None
    raise DcnbError(f"search's cluster must be a dask.distributed Client or a scheduler's address, not {cluster!r}")


def threads(dask_client) -> int:
    """How many compiles the cluster's workers run at once."""
    return sum(w.get("nthreads", 1) for w in dask_client.scheduler_info()["workers"].values())


class DaskCompiles:
    """build.Compiles on a Dask cluster: each SDFG's code generated here (a forked process per SDFG), compiled on a
    worker, its libraries written into the build folder here and the folder marked finished. Leaving the block
    stops the generating processes and cancels the compiles on the workers."""

    def __init__(self, dask_client, limit: float):
        self._client = dask_client
        self._limit = limit
        self._jobs: dict[str, tuple[dace.SDFG, str, str, str | None, str]] = {}
        self._deadlines: dict[str, float] = {}
        self._generating: dict[str, forked.Child] = {}
        self._compiling: dict[str, Any] = {}  # a name -> its future on the cluster
        self._ended: dict[str, _Ended] = {}
        self._told: set[str] = set()  # the names a wait returned
        # workers on this machine (a local cluster's) pause while a candidate is timed, as compiles here do
        self._here = _workers_here(dask_client)
        alone.register(self)

    def __enter__(self) -> DaskCompiles:
        return self

    def start(self, sdfg: dace.SDFG, key: str, device: str, cuda_arch: str | None, args: str) -> None:
        if sdfg.name in self._jobs:
            return
        self._jobs[sdfg.name] = (sdfg, key, device, cuda_arch, args)
        with forked.interrupts_deferred():
            self._generating[sdfg.name] = forked.Child(
                builder.build_unless_built, sdfg, key, device, cuda_arch, args, False
            )
        self._deadlines[sdfg.name] = time.monotonic() + self._limit

    def running(self, name: str) -> bool:
        return name in self._jobs

    def wait(self, names: Iterable[str], report: Callable[[str, str], None] | None = None) -> dict[str, object]:
        results: dict[str, object] = {}
        pending = {n for n in names if n in self._jobs}
        heard = dict.fromkeys(pending, "")

        def hear(name: str, stage: str) -> None:
            if report is not None and stage != heard[name]:
                heard[name] = stage
                report(name, stage)

        while pending:
            for name in sorted(pending):
                if name in self._generating:
                    child = self._generating[name]
                    stage = child.stage()  # (one cut short as the process rewrites it is not heard)
                    hear(name, stage if stage in builder.STAGES else heard[name])
                    if child.done() and (ended := self._generated(name, child)) is not None:
                        self._ended[name] = ended
                elif name in self._compiling and self._compiling[name].done():
                    future = self._compiling.pop(name)
                    self._ended[name] = _Ended(lambda: self._install(name, future.result()))
                if name in self._compiling:
                    hear(name, builder.ON_WORKER)
                elif name in self._ended:
                    # (another candidate's wait may have ended it: it was built once, counted once)
                    results[name] = self._ended[name].outcome() and name not in self._told
                    self._told.add(name)
                    pending.discard(name)
                    hear(name, "")
            late = [n for n in sorted(pending) if time.monotonic() > self._deadlines[n]]
            if late:
                raise CompileError(
                    f"compiling {', '.join(map(readable_sdfg, late))} on the cluster timed out after "
                    f"{self._limit:g} s and was stopped; DCNB_COMPILE_TIMEOUT sets the limit in seconds"
                )
            if pending:
                time.sleep(0.02)
        return results

    def _generated(self, name: str, child: forked.Child) -> _Ended | None:
        """The code generated here sent to a worker to compile (None); where the folder was built meanwhile, or
        the generation failed, how it ended."""
        del self._generating[name]
        try:
            generated = _Ended(child.result)
        finally:
            child.reap()
        if generated.error is not None or not generated.value:
            return generated
        sdfg, key, device, cuda_arch, args = self._jobs[name]
        self._compiling[name] = self._client.submit(
            compile_on_worker,
            _packed(builder._folder(key, sdfg)),
            name,
            device,
            cuda_arch,
            args,
            native_flags() if device == "cpu" else "",
            key=f"dcnb-compile-{key}",
            pure=False,
        )
        return None

    def _install(self, name: str, outcome: dict[str, Any]) -> bool:
        """A worker's libraries written into the build folder here, which is then marked finished; False where
        another process finished it meanwhile."""
        if "error" in outcome:
            raise CompileError(outcome["error"], log=outcome["log"])
        sdfg, key, *_ = self._jobs[name]
        folder = builder._folder(key, sdfg)
        with cache.writing(), cache.locked([folder]):
            if builder._on_disk(sdfg, key):
                return False
            libraries = folder / "build"
            libraries.mkdir(exist_ok=True)
            for file, data in outcome["libraries"].items():
                (libraries / file).write_bytes(data)
            builder.finished(folder, sdfg)
        return True

    def _pause(self) -> None:
        for child in self._generating.values():
            child.pause()
        for pid in self._here:
            forked.signal_tree(pid, signal.SIGSTOP)

    def _resume(self) -> None:
        for pid in self._here:
            forked.signal_tree(pid, signal.SIGCONT)
        for child in self._generating.values():
            child.resume()

    def __exit__(self, *exc) -> None:
        with forked.interrupts_deferred():  # the futures too: one held interrupt is raised after both
            forked.stop_all(self._generating.values())
            for future in self._compiling.values():
                future.cancel()
        self._generating, self._compiling = {}, {}
        self._here = []  # nothing more to pause


def _workers_here(dask_client) -> list[int]:
    """The process ids of the cluster's workers that run on this machine."""
    here = socket.gethostname()
    where = dask_client.run(lambda: (socket.gethostname(), os.getpid()))
    return [pid for host, pid in where.values() if host == here]


class _Ended:
    """How a compile ended: ``fn(*args)``'s value (True: built here), or the error it raised, raised again to each
    candidate that waits for it."""

    def __init__(self, fn: Callable, *args):
        self.value, self.error = None, None
        try:
            self.value = fn(*args)
        except forked.Lost as e:
            self.error = CompileError(f"the code generation process {e}")
        except Exception as e:
            self.error = e

    def outcome(self) -> object:
        if self.error is not None:
            raise self.error
        return self.value


def compile_on_worker(
    sources: bytes, name: str, device: str, cuda_arch: str | None, args: str, native: str
) -> dict[str, Any]:
    """On a worker: compile a generated program folder (``sources``, a tar) in a folder of its own; its libraries
    (``{"libraries": {file: bytes}}``), or the compiler's error (``{"error": ..., "log": ...}``)."""
    with tempfile.TemporaryDirectory(prefix="dcnb-") as tmp:
        folder = pathlib.Path(tmp) / name
        with tarfile.open(fileobj=io.BytesIO(sources)) as tar:
            tar.extractall(folder, filter="data")
        try:
            with dace.config.temporary_config():
                if native:  # this machine's CPU for the one the candidates are timed on
                    flags = Config.get("compiler", "cpu", "args").replace("-march=native", native)
                    Config.set("compiler", "cpu", "args", value=flags)
                builder.compile_generated(str(folder), name, device, cuda_arch, args)
        except CompileError as e:
            return {"error": str(e), "log": e.log}
        return {"libraries": {p.name: p.read_bytes() for p in (folder / "build").glob("lib*") if p.is_file()}}


def _packed(folder: pathlib.Path) -> bytes:
    """The generated program folder as a tar, without a build folder (none is there before its compile)."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder)
            if path.is_file() and relative.parts[0] != "build" and not path.name.endswith(".lock"):
                tar.add(path, arcname=str(relative))
    return data.getvalue()


@functools.cache
def native_flags() -> str:
    """What ``-march=native`` means on this machine, as GCC expands it (the CPU's name, each of its features and
    its caches), for a worker whose own CPU differs."""
    compiler = Config.get("compiler", "cpu", "executable") or "c++"
    try:
        shown = subprocess.run(
            [compiler, "-march=native", "-E", "-v", "-x", "c++", os.devnull], capture_output=True, text=True, check=True
        ).stderr
    except (OSError, subprocess.CalledProcessError):
        return "-march=native"  # a compiler that does not say: the worker's own CPU
    line = next((line for line in shown.splitlines() if "cc1plus" in line and "-march=" in line), "")
    words, flags = shlex.split(line), []
    for i, word in enumerate(words):
        if word.startswith("-m"):
            flags.append(word)
        elif word == "--param" and i + 1 < len(words):
            flags += [word, words[i + 1]]
    return shlex.join(flags) if flags else "-march=native"
