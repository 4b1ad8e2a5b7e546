"""PyTorch's own CPU kernels, called from generated code: its convolutions, which on x86-64 are oneDNN's, and
oneDNN's matrix products (blas.py).

A convolution of one group runs as im2col and a BLAS product otherwise (fixes/conv.py), a grouped one as C++ loops;
at full size both lose to the kernels eager calls (ResNet-50, training, 2x3x224x224: dcnb's convolutions 324 ms,
eager's 241). As the BLAS route reaches PyTorch's MKL (blas.py), this one reaches its convolutions: a small C++
library (``torch_kernels.cpp``) wraps the generated code's pointers as tensors (``at::from_blob``, no copy) and calls
``at::convolution`` and ``at::convolution_backward``, which choose the kernel as eager does. It is built once per
PyTorch and source (6-14 s) into the build cache and linked by path: in the background from the start of a session
whose module has a convolution (``start``), else by the first build whose SDFG has one.

``DCNB_CONV=loops`` keeps dcnb's own code (im2col and the BLAS, loops for groups); unset, PyTorch's kernels are used
where the library builds here.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import warnings

import dace
import torch
from dace.config import Config

from . import blas, cache

SOURCE = pathlib.Path(__file__).with_name("torch_kernels.cpp")
HEADER = pathlib.Path(__file__).with_name("torch_kernels.h")
CHOICES = ("torch", "loops")


def wanted() -> bool:
    """Whether convolutions on the CPU should call PyTorch's kernels (``DCNB_CONV``, default ``torch``)."""
    choice = os.environ.get("DCNB_CONV", "").strip().lower() or "torch"
    if choice not in CHOICES:
        raise ValueError(f"DCNB_CONV must be one of {', '.join(CHOICES)}, not {choice!r}")
    return choice == "torch"


def library() -> pathlib.Path | None:
    """The library for convolutions, built here on first use; None where it is not wanted or cannot be built (then
    once a warning saying why: convolutions keep dcnb's own code)."""
    return bridge() if wanted() else None


def bridge() -> pathlib.Path | None:
    """The library, whatever ``DCNB_CONV`` says (matrix products call it too: blas.py), built here on first use;
    None where it cannot be built (then once a warning saying why)."""
    return _built(cache.root().absolute(), digest())


def avx512() -> bool:
    """Whether ATen's CPU dispatch picks its AVX-512 kernels on this machine."""
    return torch.backends.cpu.get_cpu_capability() == "AVX512"


def for_pointwise() -> bool:
    """Whether 1x1 convolutions call PyTorch's kernels too: where ATen dispatches to its AVX-512 kernels. Elsewhere
    they are BLAS products (fixes/conv.py). Measured, forward+backward in training mode: on an AVX-512 machine
    PyTorch's took ResNet-50 (8x3x224x224) to 1.015x eager's time and at 2x3x224x224 to 1.04x, where the products
    and the copies into and out of their layout took 1.37x and 1.31x; on an AVX2 machine the products were the
    faster, 0.82x against 1.11x in geometric mean over seven 1x1 shapes of ResNet-50 and EfficientNet-B0 (batch 2)."""
    return avx512()


def for_depthwise(window: tuple[int, ...], strides: tuple[int, ...], image: tuple[int, ...]) -> bool:
    """Whether a depthwise convolution (as many groups as channels) calls PyTorch's kernels, whose backward then
    takes its operands channels-last (torch_kernels.cpp): where ATen dispatches to AVX-512, for a square 2-D window
    of 3, 5 or 7 at stride 1 over an image wider than the window. Elsewhere dcnb's loops were the faster. Measured,
    forward+backward in training mode, batch 8, ConvNeXt-T's and EfficientNet-B0's depthwise shapes on an AVX-512
    machine (benchmarks/NOTES.md): there PyTorch's took 0.25-0.82x the loops' time, at stride 2 3.7x and 0.85x, and
    over a 7x7 image with a 7x7 window 3x. On AVX2 the loops were measured the faster throughout."""
    return (
        avx512()
        and len(window) == 2
        and window[0] == window[1] in (3, 5, 7)
        and all(s == 1 for s in strides)
        and all(side > window[0] for side in image)
    )


@functools.cache
def digest() -> str:
    """What the library's build depends on: PyTorch's version and its sources."""
    digest = hashlib.sha256(torch.__version__.encode())
    for path in (SOURCE, HEADER, pathlib.Path(__file__)):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def key(sdfg: dace.SDFG) -> str:
    """What the build cache keys on: which library of PyTorch's kernels ``sdfg`` may call, if any. The library is
    not built for an SDFG that can call none (a transformer's first build on a machine waited 6-16 s for it)."""
    if not may_call(sdfg):
        return "none"
    # the choices of for_pointwise and for_depthwise follow the CPU's capability
    return f"torch:{digest()}:avx512={avx512()}" if library() is not None else "loops"


#: library nodes that expand into a node that may call the library (an ONNX Conv into a Convolution): named where
#: they are expanded (fixes/conv.py)
EXPANDING_TO_CALLERS: list[type[dace.nodes.LibraryNode]] = []


def may_call(sdfg: dace.SDFG) -> bool:
    """Whether ``sdfg`` may call the library: from code already expanded, or from a library node one of whose
    expansions calls it."""
    return any(_may_call(node) for node, _ in sdfg.all_nodes_recursive())


def _may_call(node: dace.nodes.Node) -> bool:
    if TorchKernels.full_class_path() in (getattr(node, "environments", None) or ()):
        return True
    if isinstance(node, tuple(EXPANDING_TO_CALLERS)):
        return True
    expansions = getattr(type(node), "implementations", {}) if isinstance(node, dace.nodes.LibraryNode) else {}
    return any(TorchKernels in getattr(e, "environments", ()) for e in expansions.values())


_NAME = "libdcnb_torch_kernels.so"


class _Compile:
    """The compiler building the library into a partial file of its folder, in its own process."""

    def __init__(self, folder: pathlib.Path):
        torch_dir = pathlib.Path(torch.__file__).parent
        compiler = Config.get("compiler", "cpu", "executable") or shutil.which("c++") or "g++"
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".so", delete=False) as partial:
            self.partial = partial.name
        command = [
            compiler, "-O2", "-shared", "-fPIC", "-std=c++20", "-w",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-I{torch_dir / 'include'}", f"-I{HEADER.parent}", str(SOURCE),
            f"-L{torch_dir / 'lib'}", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{torch_dir / 'lib'}",
            "-o", self.partial,
        ]  # fmt: skip
        try:
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        except OSError:  # no compiler at that path: no partial file left behind
            os.unlink(self.partial)
            raise
        #: a forked process inherits this object, not the compiler as its child: it compiles on its own
        self.owner = os.getpid()

    def finish(self) -> str | None:
        """Wait for the compiler: None where it built the partial file, else the last line it printed."""
        stderr = self.process.communicate()[1].strip()
        if self.process.returncode == 0:
            return None
        os.unlink(self.partial)
        return stderr.splitlines()[-1] if stderr else str(self.process.returncode)


#: the compiles ``start`` began, by folder, until a build takes theirs (``_built``)
_ahead: dict[pathlib.Path, _Compile] = {}


def start() -> None:
    """Begin building the library, where convolutions call it (``wanted``) and it is not built yet, in a compiler's
    process of its own: a session whose module or graph has a convolution calls this before its first build, which
    then finds the library built or waits only for the rest of its compile (where the first build made it, it waited
    10-14 s for it while preparing the backward's compile, with the other core idle). A failure is reported where a
    build takes it."""
    if not wanted():
        return
    root = cache.root().absolute()
    folder = _folder(root, digest())
    if folder in _ahead or (folder / _NAME).is_file():
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _ahead[folder] = _Compile(folder)
    except OSError:  # an unwritable cache, no compiler: the build that needs the library says so
        return
    atexit.register(_taken_at_exit, root, digest())


def _taken_at_exit(root: pathlib.Path, digest: str) -> None:
    """A compile ``start`` began that no build took, finished where it began: the next process finds it built."""
    ahead = _ahead.get(_folder(root, digest))
    if ahead is not None and ahead.owner == os.getpid():
        _built(root, digest)


def _folder(root: pathlib.Path, digest: str) -> pathlib.Path:
    return root / "torch_kernels" / digest


@functools.cache
def _built(root: pathlib.Path, digest: str) -> pathlib.Path | None:
    folder = _folder(root, digest)
    target = folder / _NAME
    with cache.writing(), cache.locked([folder]):
        ahead = _ahead.pop(folder, None)
        if target.is_file():
            if ahead is not None and ahead.owner == os.getpid() and ahead.finish() is None:
                os.unlink(ahead.partial)  # another process built it meanwhile
            return target
        folder.mkdir(parents=True, exist_ok=True)
        build = ahead if ahead is not None and ahead.owner == os.getpid() else _Compile(folder)
        failure = build.finish()
        if failure is not None:
            warnings.warn(
                "dcnb could not build its bridge to PyTorch's kernels, and keeps its own convolutions (im2col and a "
                f"BLAS) and MKL's products: {failure}",
                stacklevel=2,
            )
            return None
        os.replace(build.partial, target)  # whole or not at all, for the next process
    return target


@dace.library.environment
class TorchKernels(blas.LinkedByPath):
    """The library above, linked by path; ``torch_kernels.h`` declares its calls."""

    headers = [HEADER.name]

    @staticmethod
    def cmake_includes() -> list[str]:
        return [str(HEADER.parent)]

    @staticmethod
    def cmake_libraries() -> list[str]:
        found = library()
        return [] if found is None else [str(found)]
