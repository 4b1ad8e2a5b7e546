"""Allocation lifetimes of transients: allocated once per loaded binary, except where a call must start from zero."""

from __future__ import annotations

import dace
from dace.sdfg import nodes
from dace.transformation.auto.auto_optimize import make_transients_persistent


def persistent_gpu_transients(sdfg: dace.SDFG) -> None:
    """GPU transients allocated once per loaded binary, not with cudaMalloc and cudaFree on every call."""
    make_transients_persistent(sdfg, dace.DeviceType.GPU)


def zeroed_transients_per_call(sdfg: dace.SDFG) -> int:
    """Give transients that must start at zero a lifetime of one call again; returns how many changed.

    gap: DaCe's auto_optimize makes transients persistent (allocated once per loaded binary), but an access node's
    ``setzero`` zeroes an array where it is allocated: autodiff's zero-initialized gradient accumulators then kept
    the previous call's sums, and gradients grew with every training step.
    """
    changed = set()
    for node, state in sdfg.all_nodes_recursive():
        if isinstance(node, nodes.AccessNode) and node.setzero:
            desc = state.sdfg.arrays[node.data]
            if desc.transient and desc.lifetime == dace.AllocationLifetime.Persistent:
                desc.lifetime = dace.AllocationLifetime.Scope
                changed.add((id(state.sdfg), node.data))
    return len(changed)
