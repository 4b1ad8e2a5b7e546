"""The BLAS that CPU builds call for matrix products, and the DaCe environments that link it.

Every matrix product reaches one of DaCe's BLAS library nodes (ONNX MatMul and Gemm lower to Einsum, whose
expansion makes a matrix product a BLAS MatMul node, a Gemm or a BatchedMatMul), forward and backward (autodiff
differentiates a product into Einsums). Those expand to plain loops unless a node names a BLAS implementation;
``fixes.linalg`` makes them call the library chosen here:

- ``torch``: the BLAS PyTorch's CPU library calls itself (MKL in the x86-64 wheels), through the Fortran
  ``sgemm_``/``dgemm_`` that ``libtorch_cpu`` exports (``blas_torch.h`` puts DaCe's cblas calls on them). Nothing
  to install, the kernels eager runs, and the same threads: MKL there runs on PyTorch's OpenMP runtime, as many
  threads as ``torch.get_num_threads()``. A batched product (attention's) is one call of its ``sgemm_batch_``,
  which spreads the batch over the threads as eager's bmm does, where DaCe's expansion loops over single GEMMs;
- ``openblas``: Debian's OpenBLAS built with OpenMP (``libopenblas-openmp-dev``, which ``scripts/setup.sh``
  installs). It reads ``omp_get_max_threads()`` on every call, which ``torch.set_num_threads`` sets, so it too
  runs as many threads as PyTorch, on the same OpenMP runtime. Debian's default build (pthreads) keeps threads of
  its own spinning beside OpenMP's; on two cores it stalled PyTorch's kernels by 8-16 ms per call
  (benchmarks/NOTES.md, BLAS), so the environment links the OpenMP build by path, whatever ``libblas.so.3`` is;
- ``none``: DaCe's pure expansions (loops), as before.

``DCNB_BLAS`` names the choice; unset, the first of ``torch`` and ``openblas`` found here is used (measured:
benchmarks/NOTES.md, BLAS).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import os
import pathlib
import sysconfig

import dace
import dace.libraries.blas
import dace.library
import torch

CHOICES = ("torch", "openblas", "none")
HEADER = pathlib.Path(__file__).with_name("blas_torch.h")
#: where DaCe keeps ``dace_blas.h`` (constants its BLAS expansions use for complex types)
_DACE_BLAS_INCLUDE = pathlib.Path(dace.libraries.blas.__file__).parent / "include"


@dataclasses.dataclass(frozen=True)
class Blas:
    """A BLAS that generated CPU code can call: its library, and the folders holding the headers it needs."""

    name: str
    library: pathlib.Path
    includes: tuple[pathlib.Path, ...]
    version: str
    #: whether it multiplies a strided batch of matrices in one call (MKL's ``sgemm_batch_``, ``blas_torch.h``)
    batched: bool = False


@functools.cache
def _torch() -> Blas | None:
    """PyTorch's own BLAS, where its CPU library exports the Fortran GEMMs (MKL's, in the x86-64 wheels)."""
    library = pathlib.Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:  # the copy ``import torch`` loaded (RTLD_NOLOAD: never a second one)
        exported = ctypes.CDLL(str(library), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None
    if not all(hasattr(exported, name) for name in ("sgemm_", "dgemm_")):
        return None
    batched = all(hasattr(exported, name) for name in ("sgemm_batch_", "dgemm_batch_"))
    return Blas("torch", library, (HEADER.parent,), torch.__version__, batched)


@functools.cache
def _openblas() -> Blas | None:
    """Debian's OpenMP build of OpenBLAS: its library and its headers (``libopenblas-openmp-dev``)."""
    arch = sysconfig.get_config_var("MULTIARCH") or f"{os.uname().machine}-linux-gnu"
    library = pathlib.Path(f"/usr/lib/{arch}/openblas-openmp/libopenblas.so.0")
    include = pathlib.Path(f"/usr/include/{arch}/openblas-openmp")
    if library.is_file() and (include / "cblas.h").is_file():
        return Blas("openblas", library, (include, _DACE_BLAS_INCLUDE), library.resolve().name)
    return None


_FIND = {"torch": _torch, "openblas": _openblas}


def available() -> list[str]:
    """The BLAS found here, in the order ``chosen`` prefers them."""
    return [name for name, find in _FIND.items() if find() is not None]


def chosen() -> Blas | None:
    """The BLAS CPU builds call, or None for DaCe's loops: the one ``DCNB_BLAS`` names, else the first found."""
    wanted = os.environ.get("DCNB_BLAS", "").strip().lower()
    if wanted not in ("", *CHOICES):
        raise ValueError(f"DCNB_BLAS must be one of {', '.join(CHOICES)}, not {wanted!r}")
    if wanted == "none":
        return None
    if wanted:
        found = _FIND[wanted]()
        if found is None:
            raise ValueError(f"DCNB_BLAS={wanted}, but it is not available here: {_missing(wanted)}")
        return found
    found = available()
    return _FIND[found[0]]() if found else None


def _missing(name: str) -> str:
    if name == "torch":
        return "this PyTorch's CPU library does not export sgemm_ and dgemm_"
    return "Debian's OpenMP build of OpenBLAS is not installed (apt-get install libopenblas-openmp-dev)"


def key() -> str:
    """What the build cache keys on: the BLAS chosen, its library and version, and the code that links it."""
    blas = chosen()
    return "none" if blas is None else f"{blas.name}:{blas.library}:{blas.version}:{blas.batched}:{_code_digest()}"


@functools.cache
def _code_digest() -> str:
    digest = hashlib.sha256()
    for path in (pathlib.Path(__file__), HEADER):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class LinkedByPath:
    """A DaCe environment of a library linked by its path, its headers found by path: no CMake packages to find
    (subclasses give ``headers``, ``cmake_includes`` and ``cmake_libraries``)."""

    cmake_minimum_version = None
    cmake_packages = []
    cmake_variables = {}
    cmake_compile_flags = []
    cmake_link_flags = []
    cmake_files = []
    state_fields = []
    init_code = ""
    finalize_code = ""
    dependencies = []


class _Linked(LinkedByPath):
    """What dcnb's BLAS environments share: the library found for their BLAS and its headers."""

    blas = ""  # the name in CHOICES

    @classmethod
    def cmake_includes(cls) -> list[str]:
        found = _FIND[cls.blas]()
        return [] if found is None else [str(p) for p in found.includes]

    @classmethod
    def cmake_libraries(cls) -> list[str]:
        found = _FIND[cls.blas]()
        return [] if found is None else [str(found.library)]


@dace.library.environment
class TorchBLAS(_Linked):
    """PyTorch's CPU library (its MKL), linked by path; ``blas_torch.h`` declares the cblas calls over it."""

    blas = "torch"
    headers = [HEADER.name]


@dace.library.environment
class OpenBLAS(_Linked):
    """Debian's OpenMP build of OpenBLAS, linked by path: DaCe's own OpenBLAS environment links whatever
    ``libblas.so.3`` points to (the pthreads build when both are installed) and needs LAPACK and LAPACKE besides."""

    blas = "openblas"
    headers = ["cblas.h", "dace_blas.h"]


#: the environment that links each BLAS
ENVIRONMENTS = {"torch": TorchBLAS, "openblas": OpenBLAS}
