"""The user's working directory as dcnb found it.

DaCe saves an SDFG it finds invalid, or cannot generate code for, into ``_dacegraphs/`` there, and onnxruntime's
symbolic shape inference saves the model as ``sym_shape_infer_temp.onnx`` where some shape escapes it (a Swin's
shifted windows): a notebook's folder would fill with files nobody asked for. dcnb's errors say what failed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

#: what DaCe's validation and code generation save for inspection
_DACE_FOLDER = "_dacegraphs"
LEFTOVERS = (f"{_DACE_FOLDER}/invalid.sdfgz", f"{_DACE_FOLDER}/failing.sdfgz", "sym_shape_infer_temp.onnx")


@contextlib.contextmanager
def untouched() -> Iterator[None]:
    """Remove what the block leaves of ``LEFTOVERS`` (and DaCe's folder, where the block made it)."""
    existed = {path for path in (*LEFTOVERS, _DACE_FOLDER) if os.path.lexists(path)}
    try:
        yield
    finally:
        for path in LEFTOVERS:
            if path not in existed:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
        if _DACE_FOLDER not in existed:
            with contextlib.suppress(OSError):  # gone, or holding what someone else put there
                os.rmdir(_DACE_FOLDER)
