"""Content keys for builds: the SDFG's hash plus everything else that changes the binary."""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import platform

import dace

from . import fixes
from .version import VERSION


def root() -> pathlib.Path:
    """Where builds live: $DCNB_CACHE, else ~/.cache/dcnb."""
    path = os.environ.get("DCNB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "dcnb")
    return pathlib.Path(path)


def key(sdfg: dace.SDFG, device: str, flags: dict[str, str]) -> str:
    """sha256 over named entries, as jax's cache_key does: content, versions, device and compiler flags."""
    entries = {
        "sdfg": sdfg.hash_sdfg(),
        "dcnb": VERSION,
        "fixes": _fixes_digest(),
        "dace": dace.__version__,
        "machine": platform.machine(),
        "device": device,
        **flags,
    }
    digest = hashlib.sha256()
    for name in sorted(entries):
        digest.update(f"{name}={entries[name]}\n".encode())
    return digest.hexdigest()


@functools.cache
def _fixes_digest() -> str:
    """The expansions dcnb registers with DaCe decide the code of library nodes at code generation, after the SDFG
    was hashed: a change to them must not reuse a binary built with the old ones."""
    digest = hashlib.sha256()
    for module in fixes.FAMILIES + (fixes.cpp, fixes.registry):
        digest.update(pathlib.Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]
