"""Fixes for gaps in DaCe 2.0.0b1 made through its extension points, one module per op family as DaCe's own
``libraries/onnx/op_implementations`` are: pure expansions registered for ONNX ops it cannot expand (or expands
wrong), and backward rules registered for ops whose derivative it lacks or gets wrong. Each fix names its gap in a
one-line ``# gap:`` comment and has a test in tests/compile/test_fixes.py.

Importing this package installs them. Passes over whole SDFGs are not here: they run in phases (``passes``).
"""

from __future__ import annotations

# each registers on import
from . import (  # noqa: F401
    array_ops, conv, elementwise, linalg, loss, normalization, pooling, reduce_node, reduction, resize, sorting,
)
