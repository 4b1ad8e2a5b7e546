"""cuBLAS and cuDNN for CUDA builds, reached as CPU builds reach PyTorch's MKL (``blas.py``): through the copies
PyTorch's CUDA build has loaded into the process, with no header or library of theirs needed to build.

``gpu_libs.h`` declares the few types and functions generated code calls and resolves each with ``dlsym`` at first
use (``RTLD_NOLOAD`` first: the very libraries eager calls). The environments here give a binary one handle per
library, created when it is loaded and destroyed when it is unloaded; every call binds it to the stream the call's
kernels run on (``__dace_current_stream``). ``fixes.linalg``, ``fixes.conv`` and ``fixes.pooling`` choose them for
nodes in GPU memory outside kernels.
"""

from __future__ import annotations

import pathlib

import dace.library

HEADER = pathlib.Path(__file__).with_name("gpu_libs.h")

#: how generated code reports a failed library call: as DaCe's own checks record a failed CUDA call, so the
#: caller's check of the binary's last error raises
FAILED = "__state->gpu_context->record_error(cudaErrorUnknown);"


class _Header:
    """What both environments share: ``gpu_libs.h`` by path, included where the state struct is declared (the
    host code and the CUDA code both declare it), nothing to link."""

    cmake_minimum_version = None
    cmake_packages = []
    cmake_variables = {}
    cmake_includes = [str(HEADER.parent)]
    cmake_libraries = []
    cmake_compile_flags = []
    cmake_link_flags = []
    cmake_files = []
    headers = {"frame": [HEADER.name], "cuda": [HEADER.name]}
    dependencies = []


@dace.library.environment
class CuBLAS(_Header):
    """cuBLAS's handle, as the binary's state field ``dcnb_cublas``."""

    state_fields = ["dcnb_gpu::Cublas dcnb_cublas;"]
    init_code = "__result |= !__state->dcnb_cublas.create();"
    finalize_code = "__state->dcnb_cublas.destroy();"


@dace.library.environment
class CuDNN(_Header):
    """cuDNN's handle and the workspace the binary's convolutions share, as the state field ``dcnb_cudnn``."""

    state_fields = ["dcnb_gpu::Cudnn dcnb_cudnn;"]
    init_code = "__result |= !__state->dcnb_cudnn.create();"
    finalize_code = "__state->dcnb_cudnn.destroy();"


def field_name(kind: str, sdfg) -> str:
    """A state field of its own for a node (its descriptors, chosen once per loaded binary): unique in the binary,
    numbered in the order the nodes expand, which is the same in every process."""
    root = sdfg
    while root.parent_sdfg is not None:
        root = root.parent_sdfg
    taken: set[str] = root.__dict__.setdefault("_dcnb_state_fields", set())
    name = f"dcnb_{kind}_{len(taken)}"
    taken.add(name)
    return name


def dims(values) -> str:
    """A C++ array literal of ints."""
    return "{" + ", ".join(str(int(v)) for v in values) + "}"
