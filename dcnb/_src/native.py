"""The C++ per-call path (native.cpp): built once per machine and PyTorch version, in the background while a
session's first step compiles, with PyTorch's own extension builder (into its folder for them,
``$TORCH_EXTENSIONS_DIR`` or ~/.cache/torch_extensions, shared by every process and build cache).

Where it cannot be built (no Python headers, say) dcnb warns once and calls its binaries from Python: the same
results, with more overhead per call, and no buffer pool. ``DCNB_NATIVE=0`` chooses the Python calls (to compare
the two paths), the pool staying.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import os
import pathlib
import platform
import shutil
import sys
import types
import warnings

import torch


_SOURCE = pathlib.Path(__file__).with_name("native.cpp")


def calls() -> bool:
    """Whether compiled modules are called from C++ (``DCNB_NATIVE``, read when a step is built)."""
    return os.environ.get("DCNB_NATIVE", "1") != "0"


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
        _warn_once(f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}")
        return None


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

    from .build import put_first_on_path

    if shutil.which("ninja") is None:
        put_first_on_path(ninja.BIN_DIR)
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(
        b"\n".join([source, torch.__version__.encode(), sys.version.encode(), platform.machine().encode()])
    ).hexdigest()[:16]
    return cpp_extension.load(name=f"dcnb_native_{key}", sources=[str(_SOURCE)], extra_cflags=["-O2"], verbose=False)
