"""The code a CUDA build generates, for tests that read it (with no GPU, nvcc still builds it)."""

import pathlib
import shutil

from dace.config import Config, temporary_config

import dcnb
from dcnb._src import build


def cuda_sources(session: dcnb.Session, arch: str = "90", sdfgs: list | None = None) -> list[tuple[str, str]]:
    """(host code, CUDA code) of the session's forward and backward (or of ``sdfgs``), built by nvcc for ``arch``
    (the H100's by default: no GPU here to ask)."""
    assert shutil.which("nvcc"), "nvcc belongs to the build environment"
    # the SDFGs the session's actions transform, before the CPU build's passes made their maps host loops
    if sdfgs is None:
        sdfgs = [session._states[-1].sdfgs.forward, session._states[-1].sdfgs.backward]
    with temporary_config():
        Config.set("compiler", "cuda", "cuda_arch", value=arch)
        built = build.build(sdfgs, "cuda")
    return [built_sources(pathlib.Path(binary._lib._library_filename).parents[1]) for binary in built.binaries]


def built_sources(folder: pathlib.Path) -> tuple[str, str]:
    """(host code, CUDA code) of the CUDA build in the build ``folder``."""
    read = lambda side: "".join(f.read_text() for f in sorted((folder / "src" / side).glob("*.c*")))
    return read("cpu"), read("cuda")


def for_cuda(session: dcnb.Session) -> list:
    """The SDFGs the current step's CUDA build builds: its own, or the recipe made again for a GPU where an action of
    it makes something for the device it runs for (auto_optimize)."""
    state = session._states[-1]
    sides = session._for_cuda(state.pre, state.sdfgs, state.applied)
    return sides() if callable(sides) else sides
