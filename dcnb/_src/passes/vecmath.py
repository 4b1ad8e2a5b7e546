"""Math for generated CPU code: float overloads, libmvec vector variants and vector-type overloads (vecmath.h),
installed into an SDFG's global code by every CPU build."""

from __future__ import annotations

import ctypes.util
import functools
import pathlib

import dace

HEADER = pathlib.Path(__file__).with_name("vecmath.h")
_GUARD = "DCNB_VECMATH_H"


@functools.cache
def _header() -> str:
    return HEADER.read_text()


def install(sdfg: dace.SDFG) -> None:
    """Make the math overloads visible to the SDFG's generated CPU code (once)."""
    if _GUARD not in sdfg.global_code.get("frame", dace.properties.CodeBlock("")).as_string:
        sdfg.append_global_code(_header())


@functools.cache
def libraries() -> str:
    """Extra libraries to link CPU code with: libmvec where glibc ships it."""
    return "mvec" if ctypes.util.find_library("mvec") else ""


@functools.cache
def native_width() -> int:
    """float32 lanes of the widest vector unit the compiler targets here (-march=native)."""
    flags = pathlib.Path("/proc/cpuinfo").read_text() if pathlib.Path("/proc/cpuinfo").exists() else ""
    if " avx512f" in flags:
        return 16
    if " avx2" in flags:
        return 8
    return 4
