"""SDFGs -> loaded binaries, cached by content, the forward and backward compiled side by side."""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import io
import os
import pathlib
import re
import time
import warnings

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

from . import cache, events, passes, vecmath
from .errors import CompileError, first_line

# binaries loaded in this process, by cache key: undo and replay reuse them without reloading
_loaded: dict[str, CompiledSDFG] = {}


@dataclasses.dataclass(frozen=True)
class Built:
    binaries: list[CompiledSDFG | None]
    #: seconds spent generating and compiling code (0.0 when every SDFG came from the cache)
    seconds: float
    #: the SDFGs compiled: copies of those given, after the device's build passes (what runs, and what views draw)
    sdfgs: list[dace.SDFG | None]


def build(sdfgs: list[dace.SDFG | None], device: str) -> Built:
    """Run the device's build passes on a copy of each SDFG (None stays None) and compile it for ``device``; a
    CompileError names the failing SDFG."""
    start = time.perf_counter()
    with temporary_config(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _configure(device)
        prepared = [(None, None, "") if s is None else _prepare(s, device) for s in sdfgs]
        todo = [(s, k, args) for s, k, args in prepared if s is not None and k not in _loaded and not _on_disk(s, k)]
        folders = {k: _generate(s, k, device) for s, k, _ in todo}
        if todo:
            events.emit("build")
            _precompile_header([(folders[k], args) for _, k, args in todo])
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(todo)) as pool:
                futures = {k: pool.submit(_compile, folders[k], s.name, _config_text(args)) for s, k, args in todo}
                for k, future in futures.items():
                    future.result()
        for s, k, _ in prepared:
            if s is not None and k not in _loaded:
                _loaded[k] = compiler.load_precompiled_sdfg(_folder(k, s), s)
    seconds = time.perf_counter() - start if todo else 0.0
    return Built(
        binaries=[None if k is None else _loaded[k] for _, k, _ in prepared],
        seconds=seconds,
        sdfgs=[s for s, _, _ in prepared],
    )


def _configure(device: str) -> None:
    Config.set("compiler", "allow_view_arguments", value=True)
    Config.set("debugprint", value=False)
    if device == "cuda":
        put_first_on_path(cmake.CMAKE_BIN_DIR)
        # DaCe launches on streams of its own that do not wait for PyTorch's (non-blocking): a kernel could read
        # an input PyTorch is still computing. On the default stream, both run in the order they were issued.
        Config.set("compiler", "cuda", "max_concurrent_streams", value=-1)
    if device == "cpu" and vecmath.libraries():
        libs = Config.get("compiler", "cpu", "libs")
        Config.set("compiler", "cpu", "libs", value=f"{libs} {vecmath.libraries()}".strip())


def _own_args(sdfg: dace.SDFG, device: str) -> str:
    """Compiler flags for one SDFG's code. Where it sums along loops (reductions), GCC may reassociate the sums, as
    OpenMP's simd reductions and PyTorch's vectorized kernels do, and so vectorizes those loops (a row's sum folded
    into the loop computing its terms otherwise runs scalar); it uses 512-bit vectors where ATen picks its AVX-512
    kernels (GCC prefers 256 bits); and it unrolls loops, whose bodies here are a few vector operations on a row of
    a few hundred elements. Elsewhere none pays. NaN and inf keep working (no finite math), and every step still
    checks its results against PyTorch. Measured: benchmarks/NOTES.md, levers 12, 13, 18 and 23."""
    if device != "cpu" or not _sums_in_loops(sdfg):
        return ""
    return " -fassociative-math -funroll-loops" + (" -mprefer-vector-width=512" if _wide_vectors() else "")


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
    return torch.backends.cpu.get_cpu_capability() == "AVX512"


def put_first_on_path(folder: str) -> None:
    """Builders run the tools they find on PATH: DaCe's CUDA build needs a newer ``cmake`` than Debian 12's (the
    wheel's), PyTorch's extension builder a ``ninja`` (the wheel's, where the system has none)."""
    paths = os.environ.get("PATH", "").split(os.pathsep)
    if paths[0] != folder:
        os.environ["PATH"] = os.pathsep.join([folder, *(p for p in paths if p != folder)])


def _flags(args: str) -> dict[str, str]:
    return {
        "entry": ENTRY_VERSION,
        "cpu.args": Config.get("compiler", "cpu", "args") + args,
        "cpu.libs": Config.get("compiler", "cpu", "libs"),
        "cuda.args": Config.get("compiler", "cuda", "args"),
        "cuda.streams": str(Config.get("compiler", "cuda", "max_concurrent_streams")),
        "build_type": Config.get("compiler", "build_type"),
    }


def _prepare(sdfg: dace.SDFG, device: str) -> tuple[dace.SDFG, str, str]:
    sdfg = copy.deepcopy(sdfg)
    passes.run(passes.BUILD[device], sdfg)
    args = _own_args(sdfg, device)
    key = cache.key(sdfg, device, _flags(args))
    base = re.sub(r"_[0-9a-f]{16}$", "", sdfg.name)
    sdfg.name = f"{base}_{key[:16]}"
    sdfg.build_folder = str(_folder(key, sdfg))
    return sdfg, key, args


def _folder(key: str, sdfg: dace.SDFG):
    return cache.root() / "builds" / sdfg.name


def _on_disk(sdfg: dace.SDFG, key: str) -> bool:
    folder = _folder(key, sdfg)
    return folder.is_dir() and compiler.get_binary_name(folder, sdfg.name).is_file()


def _generate(sdfg: dace.SDFG, key: str, device: str):
    """Generate code into the build folder (on this thread: code generation is not thread-safe).

    DaCe's code generation expands library nodes and settles schedules in the SDFG it is given: it gets a copy, so
    that the SDFG shown and counted is the same whether its binary was built now or came from the cache."""
    sdfg = copy.deepcopy(sdfg)
    sdfg.fill_scope_connectors()
    try:
        objects = codegen.generate_code(sdfg, validate=True)
    except Exception as e:
        raise CompileError(f"DaCe could not generate code for {sdfg.name}: {first_line(e)}", log=str(e)) from e
    if device == "cpu":
        frame = next(o for o in objects if o.name == sdfg.name and o.title == "Frame")
        frame.code += _entry(sdfg)
    return compiler.generate_program_folder(sdfg, objects, str(_folder(key, sdfg)))


#: in every CPU build's key: a change to ``_entry``'s code must not reuse binaries built without it
ENTRY_VERSION = "1"


def entry_name(sdfg: dace.SDFG) -> str:
    return f"__dcnb_call_{sdfg.name}"


def _entry(sdfg: dace.SDFG) -> str:
    """An exported ``__dcnb_call_<name>(state, args)`` taking the program's arguments as an array of pointers, a
    scalar's to its value: one C signature for every program, which native.cpp calls without knowing its types
    (values such as floats go in other registers than pointers do)."""
    arglist = sdfg.arglist()
    names = sdfg.signature_arglist(with_types=False, arglist=arglist)
    if not all(isinstance(arglist[n], (dace.data.Array, dace.data.Scalar)) for n in names):
        return ""  # streams, structures: called from Python
    args = [
        f"*({arglist[n].dtype.ctype} *)args[{i}]" if isinstance(arglist[n], dace.data.Scalar)
        else f"({arglist[n].dtype.ctype} *)args[{i}]"
        for i, n in enumerate(names)
    ]
    return (
        f"\nDACE_EXPORTED void {entry_name(sdfg)}({sdfg.name}_state_t *state, void *const *args) {{\n"
        f"    __program_{sdfg.name}({', '.join(['state', *args])});\n}}\n"
    )


def _precompile_header(builds) -> None:
    """Build DaCe's precompiled runtime header here, once per set of flags, before the compiles start in parallel.

    DaCe stages the header under a name made of the process id only, so two threads of one process building it
    at once write the same file and leave a corrupt header that crashes every later compile (cc1plus segfaults).
    """
    for targets, args in {(_targets(folder), args) for folder, args in builds}:
        with _cpu_args(args):
            compiler.prepare_precompiled_header(dict(targets))


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


def _config_text(args: str) -> str:
    """This thread's DaCe configuration, with ``args`` added to the CPU compiler's flags."""
    with _cpu_args(args):
        text = io.StringIO()
        Config.save(file=text)
        return text.getvalue()


def _compile(folder: str, name: str, config: str) -> None:
    try:
        # DaCe's Config is per thread: a new thread starts from the defaults, without the flags set here (and in
        # the cache key), so the compile thread takes the calling thread's whole configuration
        with temporary_config():
            Config.load(file=io.StringIO(config))
            compiler.configure_and_compile(folder, name)
    except (CompilationError, CompilerConfigurationError) as e:
        log = str(e)
        raise CompileError(f"the generated code does not compile: {_compiler_error(log)}", log=log) from e


def _compiler_error(log: str) -> str:
    """The first compiler diagnostic in a build log, without its path."""
    for line in log.splitlines():
        found = re.search(r"(?:error|Error):\s*(.+)$", line)
        if found and "ninja" not in line and "make" not in line.split(":")[0]:
            return found.group(1).strip()
    return first_line(log)

