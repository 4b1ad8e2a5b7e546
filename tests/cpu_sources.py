"""The code a CPU build compiled, for tests that read it."""

import pathlib


def cpu_source(binary) -> str:
    """The C++ a binary was compiled from."""
    library = pathlib.Path(binary._lib._library_filename)
    return next((library.parents[1] / "src" / "cpu").glob("*.cpp")).read_text()
