"""SDFGs -> loaded binaries, cached by content, each compile started as soon as its SDFG is given, side by side.

Each compile runs in a forked process leading a process group of its own (``forked.Child``), so that a compile
that hangs, an interrupt or a failing sibling stops it with everything it started (cmake, ninja, the compiler). A
build folder is marked finished by its checksum file, written last; one without it, or whose libraries no longer
match it, is built again, never loaded. A lock per key lets one process build it while another waits and then loads it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import pathlib
import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Protocol

import cmake
import dace
import torch
from dace.codegen import codegen, compiler
from dace.codegen.compiled_sdfg import CompiledSDFG
from dace.codegen.exceptions import CompilationError, CompilerConfigurationError
from dace.codegen.target import TargetCodeGenerator
from dace.config import Config, temporary_config
from dace.frontend.operations import detect_reduction_type
from dace.sdfg import nodes

from . import alone, blas, cache, dace_internals, events, forked, native, passes, torch_kernels
from .errors import CompileError, DcnbError, first_line
from .names import readable_sdfg, readable_text
from .passes import vecmath

# binaries loaded in this process, by build folder (the cache's and the key's): undo and replay reuse them without
# reloading. By key alone, a process whose DCNB_CACHE changed took a binary loaded from the other cache, and the
# code view found no build folder for it in this one
_loaded: dict[pathlib.Path, CompiledSDFG] = {}

#: the stages of an SDFG's build that ``build`` reports (``Report``): made ready for the compiler here, then in
#: its compile's process (which names them to ``forked.entering``, so a compile that times out says its stage)
PREPARING = "preparing it for the compiler"
STARTING = "starting its compile"
WAITING = "waiting for the lock of its build folder"
GENERATING = "generating its code"
HEADER = "building DaCe's precompiled header"
COMPILING = "compiling its code"
#: its code compiled elsewhere (cluster.DaskCompiles)
ON_WORKER = "compiling its code on a worker of the cluster"
STAGES = (PREPARING, STARTING, WAITING, GENERATING, HEADER, COMPILING, ON_WORKER)
#: what ``build`` calls as each SDFG (as given) enters a stage of STAGES, and with "" once it is built or found built
Report = Callable[[dace.SDFG, str], None]


@dataclasses.dataclass(frozen=True)
class Built:
    binaries: list[CompiledSDFG | None]
    #: seconds the build added: generating and compiling code, less what ran meanwhile in making the next SDFG
    #: (0.0 when every SDFG came from the cache)
    seconds: float
    #: the SDFGs compiled: copies of those given, after the device's build passes (what runs, and what views draw)
    sdfgs: list[dace.SDFG | None]


def build(
    sdfgs: Iterable[dace.SDFG | None], device: str, cuda_arch: str | None = None, report: Report | None = None
) -> Built:
    """Run the device's build passes on a copy of each SDFG (None stays None) and compile it for ``device``; a
    CompileError names the failing SDFG, a CacheError the cache that cannot be written. Each SDFG's compile starts
    as soon as ``sdfgs`` gives it, so a generator making the next SDFG works while the one before compiles.
    ``cuda_arch`` (``"90"``) picks the GPU architecture a CUDA build is for; without it, DaCe's configuration says
    (by default the GPU's). ``report`` hears each SDFG's stages as it goes."""
    with compiling() as compiles:
        return start(sdfgs, device, compiles, cuda_arch, report).finish()


def compiling(at_once: int | None = None) -> Compiles:
    """Where compiles run unless a search says otherwise: processes of this machine, ``at_once`` at most at a time
    (None: each as it is started); leaving the block stops those still running."""
    return _Compiles(compile_timeout(), at_once)


class Compiles(Protocol):
    """Where a build's compiles run (``compiling``; a cluster's, ``cluster.DaskCompiles``): a context manager whose
    exit stops what still runs, so that no compiler outlives its build."""

    def __enter__(self) -> Compiles: ...

    def __exit__(self, *exc) -> None: ...

    def start(self, sdfg: dace.SDFG, key: str, device: str, cuda_arch: str | None, args: str) -> None:
        """Start (or queue) the build of ``sdfg``, prepared (``_prepare``), into its build folder; the same name
        given twice is built once."""

    def running(self, name: str) -> bool:
        """Whether a compile of that name was started (an SDFG loaded or found on disk has none)."""

    def wait(self, names: Iterable[str], report: Callable[[str, str], None] | None = None) -> dict[str, object]:
        """The result of each compile named (True: built here; False: found built), once all have ended; the first
        error is raised (leaving the block stops the others). ``report`` hears each name with each stage of STAGES it
        enters, and with "" as it ends."""


@dataclasses.dataclass
class Started:
    """A build begun (``start``): each SDFG prepared, with its cache key, its compile under way in ``compiles``
    unless it was loaded or found on disk; ``finish`` waits for them and loads the binaries."""

    #: each SDFG as prepared for the compiler (named after its key), with its key; None where None was given
    prepared: list[tuple[dace.SDFG | None, str | None]]
    device: str
    cuda_arch: str | None
    compiles: Compiles
    report: Report | None
    #: a compile's name -> the SDFG as given, which the report names
    given: dict[str, dace.SDFG]
    #: seconds spent in preparing and starting the compiles, not in making the SDFGs
    spent: float

    @property
    def names(self) -> tuple[str | None, ...]:
        """What the build makes, by content: its SDFGs' names end in their keys."""
        return tuple(None if s is None else s.name for s, _ in self.prepared)

    def finish(self) -> Built:
        started = time.perf_counter()
        staged = None if self.report is None else lambda name, stage: self.report(self.given[name], stage)
        results = self.compiles.wait([n for n in self.names if n is not None], staged)
        compiled = [name for name, built in results.items() if built]
        for _ in compiled:
            events.emit("build")
        with _configured(self.device, self.cuda_arch):
            folders = [None if k is None else _folder(k, s).absolute() for s, k in self.prepared]
            for (s, _), folder in zip(self.prepared, folders):
                if folder is not None and folder not in _loaded:
                    _loaded[folder] = compiler.load_precompiled_sdfg(folder, s)
        return Built(
            binaries=[None if folder is None else _loaded[folder] for folder in folders],
            seconds=self.spent + time.perf_counter() - started if compiled else 0.0,
            sdfgs=[s for s, _ in self.prepared],
        )


def start(
    sdfgs: Iterable[dace.SDFG | None],
    device: str,
    compiles: Compiles,
    cuda_arch: str | None = None,
    report: Report | None = None,
) -> Started:
    """``build`` up to its wait: each SDFG prepared and its compile started in ``compiles`` as ``sdfgs`` gives it."""
    spent = 0.0  # in building, not in making the next SDFG
    prepared: list[tuple[dace.SDFG | None, str | None]] = []
    given: dict[str, dace.SDFG] = {}
    heard = report or (lambda sdfg, stage: None)
    for sdfg in sdfgs:
        started = time.perf_counter()
        if sdfg is None:
            prepared.append((None, None))
        else:
            heard(sdfg, PREPARING)
            made, key = _started(compiles, sdfg, device, cuda_arch)
            prepared.append((made, key))
            given[made.name] = sdfg
            heard(sdfg, STARTING if compiles.running(made.name) else "")
        spent += time.perf_counter() - started
    return Started(prepared, device, cuda_arch, compiles, report, given, spent)


def _started(compiles: Compiles, sdfg: dace.SDFG, device: str, cuda_arch: str | None) -> tuple[dace.SDFG, str]:
    """``sdfg`` prepared, with its key; its compile started unless it is loaded or on disk already."""
    with _configured(device, cuda_arch):
        sdfg, key, args = _prepare(sdfg, device)
        if _folder(key, sdfg).absolute() not in _loaded and not _on_disk(sdfg, key):
            compiles.start(sdfg, key, device, cuda_arch, args)
    return sdfg, key


@contextlib.contextmanager
def _configured(device: str, cuda_arch: str | None):
    """For the block: this thread's DaCe configuration for building for ``device`` (a compile forked inside it
    inherits it)."""
    with temporary_config(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _configure(device, cuda_arch)
        yield


def _configure(device: str, cuda_arch: str | None) -> None:
    Config.set("compiler", "allow_view_arguments", value=True)
    Config.set("debugprint", value=False)
    if device == "cuda":
        forked.put_first_on_path(cmake.CMAKE_BIN_DIR)
        if cuda_arch:
            Config.set("compiler", "cuda", "cuda_arch", value=cuda_arch)
        # one stream, which each call sets to PyTorch's current one (module._Call, native.cpp): DaCe's own
        # streams are non-blocking and would not wait for the inputs PyTorch is computing, and the legacy default
        # stream (-1) cannot be captured into a CUDA graph
        Config.set("compiler", "cuda", "max_concurrent_streams", value=1)
    if device == "cpu" and vecmath.libraries():
        libs = Config.get("compiler", "cpu", "libs")
        Config.set("compiler", "cpu", "libs", value=f"{libs} {vecmath.libraries()}".strip())


#: GCC optimizes and generates one source file's code on one core; optimized at the link instead, it does so in
#: partitions, one per core: a 12-layer BERT's backward compiled in 5.3-8.7 s where it took 10.6-17.4 on 2 cores
LINK_TIME = " -flto=auto"
#: the nodes (``nodes_in``) from which an SDFG is optimized at its link: below, the link's second pass cost more
#: than it saved (0.1-0.4 s more on a Mish and a small MLP, 22 and 121 nodes)
LINK_TIME_AT = 300


def nodes_in(sdfg: dace.SDFG) -> int:
    """The nodes of ``sdfg``'s states and of every SDFG nested in it."""
    return sum(len(state.nodes()) for nested in sdfg.all_sdfgs_recursive() for state in nested.states())


def _own_args(sdfg: dace.SDFG, device: str) -> str:
    """Compiler flags for one SDFG's code. Where it sums along loops (reductions), GCC may reassociate the sums, as
    OpenMP's simd reductions and PyTorch's vectorized kernels do, and so vectorizes those loops (a row's sum folded
    into the loop computing its terms otherwise runs scalar); it uses 512-bit vectors where ATen picks its AVX-512
    kernels (GCC prefers 256 bits); and it unrolls loops, whose bodies here are a few vector operations on a row of
    a few hundred elements. Elsewhere none pays. NaN and inf keep working (no finite math), and every step still
    checks its results against PyTorch. A large SDFG's code is optimized at its link (``LINK_TIME``). Measured:
    benchmarks/NOTES.md, Measured choices."""
    if device != "cpu":
        return ""
    args = ""
    if _sums_in_loops(sdfg):
        args += " -fassociative-math -funroll-loops" + (" -mprefer-vector-width=512" if _wide_vectors() else "")
    if nodes_in(sdfg) >= LINK_TIME_AT:
        args += LINK_TIME
    if any(desc.dtype == dace.float16 for nested in sdfg.all_sdfgs_recursive() for desc in nested.arrays.values()):
        # gap: DaCe converts to float16 through the compiler's _Float16 where the CPU has AVX512-FP16, and GCC 12
        # dropped the rounding of a round trip (x.half().float() came out as x); its emulation rounds as PyTorch does
        args += " -DDACE_HALF_NO_NATIVE"
    return args


def _sums_in_loops(sdfg: dace.SDFG) -> bool:
    """Whether a sequential map adds into the same element over some parameter's iterations (a reduction loop)."""
    for node, state in sdfg.all_nodes_recursive():
        if isinstance(node, nodes.MapExit) and node.map.schedule == dace.ScheduleType.Sequential:
            for edge in state.in_edges(node):
                if edge.data.wcr is None or detect_reduction_type(edge.data.wcr) != dace.dtypes.ReductionType.Sum:
                    continue
                used = {str(s) for s in edge.data.subset.free_symbols}
                if any(p not in used for p in node.map.params):
                    return True
    return False


def _wide_vectors() -> bool:
    """Whether to vectorize with 512-bit registers: where ATen's own CPU dispatch picks its AVX-512 kernels."""
    return torch_kernels.avx512()


def _flags(sdfg: dace.SDFG, args: str, device: str) -> dict[str, str]:
    # the architecture only in CUDA builds' keys: CPU builds keep theirs, and the binaries cached under them
    arch = {"cuda.arch": _cuda_arch()} if device == "cuda" else {}
    return {
        **arch,
        "entry": native.ENTRY_VERSION,
        "cpu.args": Config.get("compiler", "cpu", "args") + args,
        "cpu.libs": Config.get("compiler", "cpu", "libs"),
        "cuda.args": Config.get("compiler", "cuda", "args"),
        "cuda.streams": str(Config.get("compiler", "cuda", "max_concurrent_streams")),
        "build_type": Config.get("compiler", "build_type"),
        "blas": blas.key(),  # which BLAS the matrix products call (fixes.linalg)
        "convolutions": torch_kernels.key(sdfg),  # whether convolutions call PyTorch's (fixes.conv)
    }


def _cuda_arch() -> str:
    """The architecture a CUDA build is for: the configured one, else the GPU's own (DaCe's default, "native"), so
    that binaries built on different GPUs have different keys."""
    configured = Config.get("compiler", "cuda", "cuda_arch")
    if configured or not torch.cuda.is_available():
        return configured
    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}"


def _prepare(sdfg: dace.SDFG, device: str) -> tuple[dace.SDFG, str, str]:
    sdfg = copy.deepcopy(sdfg)
    passes.run(passes.BUILD[device], sdfg)
    args = _own_args(sdfg, device)
    key = cache.key(sdfg, device, _flags(sdfg, args, device))
    base = re.sub(r"_[0-9a-f]{16}$", "", sdfg.name)
    sdfg.name = f"{base}_{key[:16]}"
    sdfg.build_folder = str(_folder(key, sdfg))
    return sdfg, key, args


def _folder(key: str, sdfg: dace.SDFG):
    return cache.root() / "builds" / sdfg.name


def _on_disk(sdfg: dace.SDFG, key: str) -> bool:
    """Whether the cache holds a finished build of ``sdfg`` whose libraries are as built: a library cut short or
    corrupted, or a build that was stopped (no checksum file), is built again rather than loaded."""
    folder = _folder(key, sdfg)
    return cache.intact(folder, compiler.get_binary_name(folder, sdfg.name))


#: seconds an SDFG's compile may take unless ``DCNB_COMPILE_TIMEOUT`` says otherwise
COMPILE_TIMEOUT = 600.0


def compile_timeout() -> float:
    """Seconds an SDFG's compile may take before it is stopped: ``DCNB_COMPILE_TIMEOUT``, else 600."""
    value = os.environ.get("DCNB_COMPILE_TIMEOUT", "").strip()
    try:
        seconds = float(value) if value else COMPILE_TIMEOUT
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:
        raise DcnbError(f"DCNB_COMPILE_TIMEOUT must be a number of seconds above 0, not {value!r}")
    return seconds


def build_unless_built(
    sdfg: dace.SDFG, key: str, device: str, cuda_arch: str | None, args: str, compile_here: bool = True
) -> bool:
    """In a compile's process: generate ``sdfg``'s code and compile it, then mark the build finished with its
    libraries' checksums; unless another process built it meanwhile (it holds the folder's lock while it builds).
    True when it built. Without ``compile_here``, the code only: it is compiled elsewhere (a cluster's worker,
    ``compile_generated``), and the folder marked finished there."""
    folder = _folder(key, sdfg)
    forked.entering(WAITING)
    with _configured(device, cuda_arch), cache.writing(), cache.locked([folder]):
        if _on_disk(sdfg, key):
            return False
        shutil.rmtree(folder, ignore_errors=True)  # what a stopped or corrupted build left is not built upon
        forked.entering(GENERATING)
        generated = _generate(sdfg, key, device)
        if compile_here:
            _compiled(generated, sdfg.name, args)
            finished(folder, sdfg)
    return True


def finished(folder: pathlib.Path, sdfg: dace.SDFG) -> None:
    """Mark ``sdfg``'s build in ``folder`` finished: its libraries' checksums, written last."""
    binary = compiler.get_binary_name(folder, sdfg.name)
    cache.record(folder, sorted(binary.parent.glob(f"lib*{binary.suffix}")))


def compile_generated(folder: str, name: str, device: str, cuda_arch: str | None, args: str) -> None:
    """Compile a program folder ``build_unless_built`` generated, wherever it now lies (a cluster's worker)."""
    with _configured(device, cuda_arch):
        _compiled(folder, name, args)


def _compiled(folder: str, name: str, args: str) -> None:
    forked.entering(HEADER)
    _precompile_header(folder, args)
    forked.entering(COMPILING)
    _compile_folder(folder, name, args)


def generate_code(sdfg: dace.SDFG, validate: bool) -> list:
    """DaCe's code objects for ``sdfg`` (its scope connectors filled first) as a build generates them: the code view
    generates a build's code again through this, and must match it line for line."""
    sdfg.fill_scope_connectors()
    with dace_internals.expansions_reused():  # the library nodes of identical layers expand once
        return codegen.generate_code(sdfg, validate=validate)


def _generate(sdfg: dace.SDFG, key: str, device: str) -> str:
    """Generate code into the build folder, in a forked process: what code generation changes in the SDFG stays
    there, so the SDFG shown and counted is the same whether its binary was built now or came from the cache."""
    try:
        objects = generate_code(sdfg, validate=True)
    except Exception as e:
        raise CompileError(
            f"DaCe could not generate code for {readable_sdfg(sdfg.name)}: {readable_text(first_line(e))}", log=str(e)
        ) from e
    frame = next(o for o in objects if o.name == sdfg.name and o.title == "Frame")
    frame.code += native.entry_code(sdfg)
    # DaCe writes a gzip of the SDFG's JSON beside the code (program.sdfgz: 14 of a ResNet-18 naive step's
    # 104 s), which dcnb never reads (it loads binaries with the SDFG in hand); without the SDFG it writes all else
    # but the header the code includes for the SDFG's hash, which gets the build's key (a hash of the SDFG and more)
    folder = compiler.generate_program_folder(None, objects, str(_folder(key, sdfg)))
    header = pathlib.Path(folder) / "include" / "hash.h"
    header.parent.mkdir(exist_ok=True)
    header.write_text(f'#define __HASH_{sdfg.name} "{key}"\n')
    return folder


def _precompile_header(folder: str, args: str) -> None:
    """Build DaCe's precompiled runtime header for the folder's targets and flags unless it is built already: one
    process at a time (another building the SDFG beside this one waits, then finds it built). DaCe stages the
    header under a name made of the process id: two threads of one process once wrote the same staging file and
    left a header that crashed cc1plus."""
    with cache.locked([cache.root() / "precompiled-header"]), _cpu_args(args):
        compiler.prepare_precompiled_header(dict(_targets(folder)))


def _targets(folder) -> frozenset:
    with open(pathlib.Path(folder) / "dace_files.csv") as f:
        names = {line.split(",")[0].strip() for line in f if line.strip()}
    return frozenset(
        (name, next(k for k, v in TargetCodeGenerator.extensions().items() if v["name"] == name)) for name in names
    )


@contextlib.contextmanager
def _cpu_args(args: str):
    """For the block: this thread's DaCe configuration with ``args`` added to the CPU compiler's flags."""
    with temporary_config():
        Config.set("compiler", "cpu", "args", value=Config.get("compiler", "cpu", "args") + args)
        yield


def _compile_folder(folder: str, name: str, args: str) -> None:
    """Configure and compile one program folder: in a forked process, which has the DaCe configuration of the
    thread that forked it (DaCe's Config is per thread), so the flags set for this build (and in its key)."""
    try:
        with _cpu_args(args):
            compiler.configure_and_compile(folder, name)
    except (CompilationError, CompilerConfigurationError) as e:
        log = str(e)
        raise CompileError(f"the generated code does not compile: {_compiler_error(log)}", log=log) from e


class _Compiles:
    """Compiles side by side, each in a process of its own, ``at_once`` at most at a time (None: no limit), each
    stopped with a CompileError ``limit`` seconds after it started; paused while a step is timed (``alone``).
    Leaving the block stops those still running (an error, an interrupt, in the block or in ``wait``): no compiler
    outlives its build, and the folders they leave have no checksum file."""

    def __init__(self, limit: float, at_once: int | None = None):
        self._limit = limit
        self._at_once = at_once
        self._queued: dict[str, tuple] = {}  # a name -> its build's arguments, in the order started
        self._children: dict[str, forked.Child] = {}
        self._deadlines: dict[str, float] = {}  # time.monotonic() values
        self._paused_at: float | None = None
        alone.register(self)

    def __enter__(self) -> _Compiles:
        return self

    def start(self, sdfg: dace.SDFG, key: str, device: str, cuda_arch: str | None, args: str) -> None:
        if sdfg.name not in self._children and sdfg.name not in self._queued:
            self._queued[sdfg.name] = (sdfg, key, device, cuda_arch, args)
            self._fork()

    def _fork(self) -> None:
        """Fork the queued compiles there is room for (none while a step is timed)."""
        while self._queued and self._paused_at is None:
            if self._at_once is not None and sum(not c.done() for c in self._children.values()) >= self._at_once:
                return
            name = next(iter(self._queued))
            # an interrupt between a fork and its record here would leave a child unstopped
            with forked.interrupts_deferred():
                self._children[name] = forked.Child(build_unless_built, *self._queued.pop(name))
            self._deadlines[name] = time.monotonic() + self._limit

    def running(self, name: str) -> bool:
        return name in self._children or name in self._queued

    def wait(self, names: Iterable[str], report: Callable[[str, str], None] | None = None) -> dict[str, object]:
        results, pending = {}, {n for n in names if self.running(n)}
        heard = dict.fromkeys(pending, "")
        while pending:
            self._fork()
            started = sorted(n for n in pending if n in self._children)
            if report is not None:
                for name in started:
                    # (a stage read while the process rewrites it may be cut short: only whole ones are heard)
                    stage = self._children[name].stage()
                    if stage in STAGES and stage != heard[name]:
                        heard[name] = stage
                        report(name, stage)
            for name in [n for n in started if self._children[n].done()]:
                pending.discard(name)
                try:
                    results[name] = self._children[name].result()
                except forked.Lost as e:
                    raise CompileError(f"the compile process {e}") from None
                if report is not None:
                    report(name, "")
            late = [n for n in started if n in pending and time.monotonic() > self._deadlines[n]]
            if late:
                stages = {n: self._children[n].stage() for n in late}
                named = [readable_sdfg(n) + (f" ({stages[n]})" if stages[n] else "") for n in late]
                raise CompileError(
                    f"compiling {', '.join(named)} timed out after {self._limit:g} s and was stopped; "
                    "DCNB_COMPILE_TIMEOUT sets the limit in seconds"
                )
            if pending:
                time.sleep(0.02)
        self._fork()  # the next build's compiles, at once: they run while this one is checked (and paused timing)
        return results

    def _pause(self) -> None:
        self._paused_at = time.monotonic()
        for child in self._children.values():
            child.pause()

    def _resume(self) -> None:
        if self._paused_at is not None:
            paused, self._paused_at = time.monotonic() - self._paused_at, None
            for name, child in self._children.items():
                self._deadlines[name] += paused  # a paused compile's time limit is moved by the pause
                child.resume()

    def __exit__(self, *exc) -> None:
        self._queued.clear()
        forked.stop_all(self._children.values())


def _compiler_error(log: str) -> str:
    """The first compiler diagnostic in a build log, without its path (nvcc's own say ``nvcc fatal   : ...``), the
    names in it read back (the log keeps DaCe's)."""
    for line in log.splitlines():
        found = re.search(r"(?:error|Error|fatal)\s*:\s*(.+)$", line)
        if found and "ninja" not in line and "make" not in line.split(":")[0]:
            return readable_text(found.group(1).strip())
    return readable_text(first_line(log))

