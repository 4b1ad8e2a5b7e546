"""The BLAS that CPU builds call for matrix products, and the DaCe environments that link it.

Every matrix product reaches one of DaCe's BLAS library nodes (ONNX MatMul and Gemm lower to Einsum, whose
expansion makes a matrix product a BLAS MatMul node, a Gemm or a BatchedMatMul), forward and backward (autodiff
differentiates a product into Einsums). Those expand to plain loops unless a node names a BLAS implementation;
``fixes.linalg`` makes them call the library chosen here:

- ``onednn``: oneDNN's matmul, which PyTorch's CPU library holds (its convolutions' library), for float products
  of at least about 128x128x128 (``blas_torch.h``), through dcnb's bridge to PyTorch's kernels
  (``torch_kernels.cpp``, ATen's ``mkldnn_matmul``); ``torch``'s MKL for the rest and for doubles. ATen runs MKL's
  GEMM for float products, eager and ``torch.compile`` alike, and MKL takes its AVX-512 paths on Intel's CPUs only:
  on an AVX-512 AMD EPYC oneDNN's took 0.44-0.59x MKL's time from 256x256x256 up, batched products too
  (benchmarks/NOTES.md, BLAS). The bridge is built by the first expansion of a product (``linked``; where it does
  not build, MKL's runs);
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

``DCNB_BLAS`` names the choice; unset, ``onednn`` where it is available and measured here at least 1.25 times as
fast as MKL's GEMM (``onednn_speedup``, once a machine), else the first of ``torch`` and ``openblas`` found here
(measured: benchmarks/NOTES.md, BLAS).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import os
import pathlib
import platform
import sysconfig

import dace
import dace.libraries.blas
import dace.library
import torch

from . import timing

CHOICES = ("onednn", "torch", "openblas", "none")
HEADER = pathlib.Path(__file__).with_name("blas_torch.h")
ONEDNN_HEADER = pathlib.Path(__file__).with_name("blas_onednn.h")
#: how many times as fast as MKL's GEMM oneDNN's must be measured here to be chosen unasked: a margin that this
#: machine's noise does not cross, so that the choice (and the builds it keys) stays the same from run to run
ONEDNN_MARGIN = 1.25
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


def _onednn() -> Blas | None:
    """oneDNN's matmul inside PyTorch for float products, MKL's GEMM for the rest: where PyTorch has both and ATen
    runs the first on this processor. Its calls go through dcnb's bridge to PyTorch's kernels (torch_kernels.py),
    built by the first expansion of a product (``linked``), not here: a build without products does not wait for
    it."""
    mkl = _torch()
    if mkl is None or not mkl.batched or not torch.backends.mkldnn.is_available():
        return None
    # ATen's mkldnn_matmul refuses float products too where its bfloat16 check fails (AVX2 alone: an AMD EPYC)
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return None
    from . import torch_kernels  # (which imports this module)

    return dataclasses.replace(mkl, name="onednn", version=f"{mkl.version}:{torch_kernels.digest()}")


_FIND = {"onednn": _onednn, "torch": _torch, "openblas": _openblas}


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
    if found[:1] == ["onednn"] and onednn_speedup() < ONEDNN_MARGIN:
        found.pop(0)
    return _FIND[found[0]]() if found else None


def linked() -> Blas | None:
    """The BLAS a product's expansion links: the one ``chosen``, but MKL's alone where that is oneDNN's and the
    bridge to it does not build here (building it on first use)."""
    from . import torch_kernels

    found = chosen()
    if found is not None and found.name == "onednn" and torch_kernels.bridge() is None:
        return _torch()
    return found


@functools.cache
def onednn_speedup() -> float:
    """How many times as fast as MKL's GEMM oneDNN's multiplies two float 512x512 matrices here (``_measure``); 0
    where oneDNN's is not available. Measured once per machine and PyTorch and kept in the build cache, which every
    process then reads: two processes measuring at once on two cores chose apart, and so keyed every build apart."""
    if _onednn() is None:
        return 0.0
    from . import cache  # (which imports this module through fixes.linalg)

    path = cache.root() / "measured" / f"onednn-speedup-{_machine()}"
    try:
        with cache.locked([path]):
            try:
                stored = float(path.read_text())
            except (OSError, ValueError):  # not measured yet, or a file cut short
                stored = 0.0
            if 0 < stored < float("inf"):  # (else measured again: nan or a negative was written wrong)
                return stored
            speedup = _measure()
            cache.write_whole(path, repr(speedup))
            return speedup
    except OSError:  # a cache that cannot be written: this process's own measurement
        return _measure()


def _measure() -> float:
    """oneDNN's speedup over MKL's GEMM: each the best of 7 calls through ATen, taken in turns after one that sets
    it up (``torch.mm`` runs MKL's, the operator ``torch.compile`` fuses linear layers with oneDNN's)."""
    a, b, c = (torch.rand(512, 512) for _ in range(3))
    b_t = b.t().contiguous()  # (the operator takes a linear layer's weight: out x in)
    calls = {
        "onednn": lambda: torch.ops.mkldnn._linear_pointwise(a, b_t, None, "none", [], ""),
        "mkl": lambda: torch.mm(a, b, out=c),
    }
    times = timing.interleaved(calls, warmup=1, min_runs=7, max_runs=7)
    return times["mkl"].min / times["onednn"].min


def _machine() -> str:
    """This machine's processor and PyTorch, for a cache that several machines share."""
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        model = ""
    described = f"{model or platform.processor()}:{os.cpu_count()}:{torch.__version__}"
    return hashlib.sha256(described.encode()).hexdigest()[:16]


# a forked process (dcnb transforms and compiles in them) hangs in OpenMP's threads once its parent has used them:
# the measurement is made in the process about to fork, and the child inherits it
os.register_at_fork(before=onednn_speedup)


def onednn_product(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """``out = a @ b`` for contiguous float matrices, or batches of them, through the bridge generated code calls
    (``dcnb_torch_sgemm``: column-major, so ``out^T = b^T a^T``)."""
    from . import torch_kernels

    (m, k), n = a.shape[-2:], b.shape[-1]
    batch = a.shape[0] if a.dim() == 3 else 1
    done = bridge_gemm(torch_kernels.bridge())(
        0, 0, n, m, k, 1.0, b.data_ptr(), n, k * n, a.data_ptr(), k, m * k, 0.0, out.data_ptr(), n, m * n, batch
    )  # fmt: skip
    if done != 0:
        raise RuntimeError("oneDNN's matmul failed (its reason is on stderr)")


@functools.cache
def bridge_gemm(library: pathlib.Path):
    """``dcnb_torch_sgemm`` of the bridge ``library`` as a ctypes function, with the arguments ``torch_kernels.h``
    declares."""
    gemm = ctypes.CDLL(str(library)).dcnb_torch_sgemm
    int64, pointer = ctypes.c_int64, ctypes.c_void_p
    gemm.argtypes = [ctypes.c_int, ctypes.c_int, *[int64] * 3, ctypes.c_float, pointer, *[int64] * 2, pointer]
    gemm.argtypes += [*[int64] * 2, ctypes.c_float, pointer, *[int64] * 3]
    return gemm


def _missing(name: str) -> str:
    if name == "onednn":
        return (
            "this PyTorch has no oneDNN, or its MKL does not export its GEMMs and batched GEMMs, or this processor "
            "lacks what ATen's oneDNN matmul asks for (AVX-512 BW, VL and DQ, or AVX-NE-CONVERT)"
        )
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
    for path in (pathlib.Path(__file__), HEADER, ONEDNN_HEADER):
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


@dace.library.environment
class OneDNNBLAS(_Linked):
    """PyTorch's CPU library and dcnb's bridge to its kernels, linked by path; ``blas_onednn.h`` declares the cblas
    calls over both."""

    blas = "onednn"
    headers = [ONEDNN_HEADER.name]

    @classmethod
    def cmake_libraries(cls) -> list[str]:
        from . import torch_kernels

        return [*super().cmake_libraries(), str(torch_kernels.bridge())]  # (linked() made sure it is built)


#: the environment that links each BLAS
ENVIRONMENTS = {"onednn": OneDNNBLAS, "torch": TorchBLAS, "openblas": OpenBLAS}
