"""Content keys for builds: the SDFG's hash plus everything else that changes the binary; and the cache's own
files: a checksum file marking a build finished, a lock per build."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import os
import pathlib
import platform
from collections.abc import Iterable, Iterator

import dace

from . import dace_internals, fixes, gpu_libs
from .errors import CacheError
from .version import VERSION

#: in a build folder, written last: the sha256 of each library built there (sha256sum's format)
CHECKSUMS = "dcnb.sha256"


def root() -> pathlib.Path:
    """Where builds live: $DCNB_CACHE, else ~/.cache/dcnb."""
    path = os.environ.get("DCNB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "dcnb")
    return pathlib.Path(path)


def key(sdfg: dace.SDFG, device: str, flags: dict[str, str]) -> str:
    """sha256 over named entries, as jax's cache_key does: content, versions, device and compiler flags."""
    entries = {
        "sdfg": sdfg.hash_sdfg(),
        "constants": _constants_digest(sdfg),
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


def _constants_digest(sdfg: dace.SDFG) -> str:
    """The ONNX model's constants, which expansions read at code generation (Clip's bounds, Slice's starts, Pow's
    exponent) from outside the SDFG, so its hash misses them: ReLU6 would reuse Hardtanh's binary."""
    digest = hashlib.sha256()
    for nested in sdfg.all_sdfgs_recursive():
        model = getattr(nested, "_parent_onnx_model", None)
        for name, value in sorted(getattr(model, "clean_weights", {}).items()):
            digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}:".encode())
            digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


@functools.cache
def _fixes_digest() -> str:
    """The expansions dcnb registers with DaCe decide the code of library nodes at code generation, after the SDFG
    was hashed: a change to them must not reuse a binary built with the old ones (nor to the cuBLAS and cuDNN
    declarations their CUDA expansions include, nor to DaCe's internals replaced, which decide the CUDA code's
    streams and host waits)."""
    digest = hashlib.sha256()
    sources = sorted(pathlib.Path(fixes.__file__).parent.glob("*.py"))  # every family and its helpers
    for source in [*sources, gpu_libs.HEADER, pathlib.Path(gpu_libs.__file__), pathlib.Path(dace_internals.__file__)]:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def record(folder: pathlib.Path, files: Iterable[pathlib.Path]) -> None:
    """Mark the build in ``folder`` finished: the checksum of each of its ``files``, written last."""
    # whole: a build stopped before it ends leaves no checksum file
    write_whole(folder / CHECKSUMS, "".join(f"{_sha256(f)}  {f.relative_to(folder)}\n" for f in files))


def write_whole(path: pathlib.Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all, for any process reading it at any moment: staged under a
    name of this process's own, then renamed over it (atomic)."""
    staging = path.with_name(f"{path.name}.{os.getpid()}")
    staging.write_text(text)
    os.replace(staging, path)


def intact(folder: pathlib.Path, binary: pathlib.Path) -> bool:
    """Whether ``folder`` holds a finished build of ``binary``: its checksum file lists the binary, and every file
    it lists is unchanged (a truncated or corrupted library is not; a build that was stopped has no such file)."""
    try:
        listed = {}
        for line in (folder / CHECKSUMS).read_text().splitlines():
            digest, name = line.split("  ", 1)
            listed[name] = digest
        return binary.relative_to(folder).as_posix() in listed and all(
            _sha256(folder / name) == digest for name, digest in listed.items()
        )
    except (OSError, ValueError):
        return False


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def locked(folders: Iterable[pathlib.Path]) -> Iterator[None]:
    """Hold the lock of each build folder (an flock on ``<folder>.lock``) for the block: one process builds a key,
    another that wants it waits, then finds it built."""
    with contextlib.ExitStack() as stack:
        for folder in sorted(set(folders)):  # one order in every process: two taking the same locks cannot deadlock
            folder.parent.mkdir(parents=True, exist_ok=True)
            lock = stack.enter_context(open(folder.with_name(folder.name + ".lock"), "a"))
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        yield


#: what writing into a directory that is read-only, full or not a directory at all fails with
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR, errno.ENOENT}


@contextlib.contextmanager
def writing() -> Iterator[None]:
    """For the block, which writes into the cache: an OSError saying that the cache cannot be written becomes a
    CacheError naming it and saying how to pick another (the user can act on that; a raw OSError they cannot)."""
    try:
        yield
    except OSError as e:
        folder = root().absolute()
        path = pathlib.Path(e.filename).absolute() if e.filename else None
        concerns_cache = path is not None and (path == folder or folder in path.parents or path in folder.parents)
        full = path is None and e.errno in (errno.ENOSPC, errno.EDQUOT)
        if e.errno not in _UNWRITABLE or not (concerns_cache or full):
            raise
        where = f" ({e.filename})" if path is not None and path != folder else ""
        raise CacheError(
            f"dcnb cannot write its build cache {folder}: {e.strerror or e}{where}; set DCNB_CACHE to a writable "
            "directory with free space to use another"
        ) from e
