"""The C++ per-call path (native.cpp): built once per machine and PyTorch version, in the background while a
session's first step compiles, with PyTorch's own extension builder (into its folder for them,
``$TORCH_EXTENSIONS_DIR`` or ~/.cache/torch_extensions, shared by every process and build cache; one process builds
it at a time, and a build that was killed midway is built again, not waited on).

Where it cannot be built (no Python headers, say) dcnb warns once and calls its binaries from Python: the same
results, with more overhead per call, and no buffer pool. ``DCNB_NATIVE=0`` chooses the Python calls (to compare
the two paths), the pool staying.

The same extension calls CUDA binaries (native.cpp says how it builds without CUDA): on PyTorch's current stream,
their calls replayed from CUDA graphs where a binary allows it (``cuda_launch``); ``DCNB_CUDA_GRAPHS=0`` turns the
graphs off. Until it has run on a GPU, CUDA binaries are called from Python unless ``DCNB_NATIVE_CUDA=1``.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import hashlib
import os
import pathlib
import platform
import re
import shutil
import sys
import types
import warnings
from typing import TYPE_CHECKING

import dace
import torch

from . import cache, dace_internals, forked

if TYPE_CHECKING:
    from dace.codegen.compiled_sdfg import CompiledSDFG


_SOURCE = pathlib.Path(__file__).with_name("native.cpp")


# --- the entry every binary exports for native.cpp --------------------------------------------------------------


#: in every build's key: a change to ``entry_code``'s code must not reuse binaries built without it (2: CUDA builds too)
ENTRY_VERSION = "2"


def entry_name(sdfg: dace.SDFG) -> str:
    return f"__dcnb_call_{sdfg.name}"


def entry_code(sdfg: dace.SDFG) -> str:
    """An exported ``__dcnb_call_<name>(state, args)`` taking the program's arguments as an array of pointers, a
    scalar's to its value: one C signature for every program, which native.cpp calls without knowing its types
    (``entry``)
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


def entry(binary: CompiledSDFG) -> tuple[int, int] | None:
    """The address of a binary's entry (``entry_code``) and its state, initialized as ``fast_call`` would on a first
    call (a program without symbols takes no initialization arguments); None where it has none."""
    found = binary.get_exported_function(entry_name(binary.sdfg))
    if found is None:
        return None
    return ctypes.cast(found, ctypes.c_void_p).value, dace_internals.initialized_state(binary)


# --- the extension ----------------------------------------------------------------------------------------------


def calls() -> bool:
    """Whether compiled modules are called from C++ (``DCNB_NATIVE``, read when a step is built)."""
    return os.environ.get("DCNB_NATIVE", "1") != "0"


def calls_cuda() -> bool:
    """Whether CUDA binaries are called from C++ too (``DCNB_NATIVE_CUDA=1``): off by default, since that path has
    run on a GPU only in ``make gpu``'s sessions (an H100, an H200: benchmarks/NOTES.md, GPU), not yet across the
    model catalog."""
    return calls() and os.environ.get("DCNB_NATIVE_CUDA", "0") == "1"


def graphs() -> bool:
    """Whether CUDA binaries' calls are replayed from CUDA graphs (``DCNB_CUDA_GRAPHS``, read when a step is built)."""
    return os.environ.get("DCNB_CUDA_GRAPHS", "1") != "0"


def cuda_launch(binary: CompiledSDFG) -> tuple[int, bool]:
    """How native.cpp calls a CUDA binary: the address of its ``__dace_gpu_set_all_streams`` where every launch and
    copy goes to the streams it is given (0 where some go to the legacy default stream: DaCe's
    ``max_concurrent_streams = -1``), and whether its calls can be captured into CUDA graphs: not where a call waits
    for its own work on the host, allocates or copies host memory (``_BLOCKING``), which capture forbids."""
    set_streams = binary.get_exported_function("__dace_gpu_set_all_streams")
    if set_streams is None:
        return 0, False
    src = pathlib.Path(binary.sdfg.build_folder) / "src"
    code = {folder: "".join(f.read_text() for f in sorted((src / folder).glob("*.c*"))) for folder in ("cpu", "cuda")}
    # a launch's or a copy's last argument is its stream ("nullptr": the legacy default one)
    calls = re.findall(r"\b(?:cudaLaunchKernel|cuda\w+Async)\((.*)\);", code["cpu"] + code["cuda"])
    if any(call.rstrip(") ").rsplit(",", 1)[-1].strip() in ("nullptr", "0", "NULL") for call in calls):
        return 0, False
    call = _without_functions(code["cpu"] + code["cuda"], ("__dace_init", "__dace_exit"))
    capturable = _BLOCKING.search(call) is None
    return ctypes.cast(set_streams, ctypes.c_void_p).value, capturable and graphs()


# what a call must not do while it is captured: wait on the host, allocate or free, set or copy memory on the
# legacy stream, or copy between host and GPU memory (a graph replays a copy from the host's stack, where each call
# wrote a new value: a constant the forward keeps for the backward). Captured with a stream synchronization (which
# DaCe's Reduce and transpose expansions ended with before 2026-11-28) and a per-call allocation, a cuBLAS call
# beside them failed and left a product's gradient reading freed memory on an H100
_BLOCKING = re.compile(
    r"\bcuda(?:\w*Synchronize|Malloc|Free|(?:Memset|Memcpy)(?:2D|3D)?)\("
    r"|\bcudaMemcpy\w*Async\([^;]*cudaMemcpy(?:HostToDevice|DeviceToHost)"
)


def _without_functions(code: str, prefixes: tuple[str, ...]) -> str:
    """``code`` less the bodies of the functions whose names start with one of ``prefixes`` (those run at load and
    unload, never in a call)."""
    kept, at = [], 0
    for match in re.finditer(rf"\b(?:{'|'.join(prefixes)})\w*\([^;{{]*?\)\s*{{", code):
        if match.start() < at:
            continue
        depth, end = 1, match.end()
        while depth and end < len(code):
            depth += {"{": 1, "}": -1}.get(code[end], 0)
            end += 1
        kept.append(code[at : match.start()])
        at = end
    return "".join(kept) + code[at:]


@functools.cache
def _building() -> concurrent.futures.Future:
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="dcnb-native")
    future = executor.submit(_build)
    executor.shutdown(wait=False)
    return future


def start() -> None:
    """Begin building (or loading) the extension, unless it is under way or done."""
    _building()


def ready() -> bool:
    """Whether ``extension()`` returns at once (built or failed)."""
    return _building().done()


def extension() -> types.ModuleType | None:
    """The loaded extension, waiting for its build; None where it could not be built."""
    try:
        return _building().result()
    except Exception as e:  # noqa: BLE001 -- any build failure means the Python path, said once
        _warn_once(f"{type(e).__name__}: {_cause(str(e))}")
        return None


def _cause(message: str) -> str:
    """The line of a failed build's output that says why: the compiler's first error, not ninja's closing
    "build stopped" (all an H100 run showed of why the extension did not build there)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    if errors:
        return errors[0]
    return lines[-1] if lines else ""


@functools.cache
def _warn_once(reason: str) -> None:
    warnings.warn(
        f"dcnb could not build its C++ call path ({reason}); compiled modules are called from Python instead, "
        "with more overhead per call",
        RuntimeWarning,
        stacklevel=3,
    )


def _build() -> types.ModuleType:
    import ninja
    from torch.utils import cpp_extension

    if shutil.which("ninja") is None:
        forked.put_first_on_path(ninja.BIN_DIR)
    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True)
    with cache.locked([folder]):
        # PyTorch's builder waits for ever on the lock file of a build that was killed (a kernel restarted during
        # its first step): every build of ours holds the flock, so a lock file found under it is such a leftover
        (folder / "lock").unlink(missing_ok=True)
        return cpp_extension.load(
            name=folder.name, sources=[str(_SOURCE)], extra_cflags=["-O2"], extra_ldflags=["-ldl"],
            build_directory=str(folder), verbose=False,
        )


def _folder() -> pathlib.Path:
    """The extension's build folder, named for its source, PyTorch, Python and the machine, and for the paths
    PyTorch's build file names: two checkouts or environments (a link and its target) that shared one folder rebuilt
    it each time the other had built last (a minute on two cores)."""
    from torch.utils import cpp_extension

    described = [torch.__version__, sys.version, platform.machine(), str(_SOURCE), torch.__file__]
    key = hashlib.sha256(b"\n".join([_SOURCE.read_bytes(), *(d.encode() for d in described)])).hexdigest()[:16]
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    return pathlib.Path(root) / f"dcnb_native_{key}"
