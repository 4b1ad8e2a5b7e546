"""Allocation lifetimes of transients: allocated once per loaded binary, except where a call must start from zero."""

from __future__ import annotations

import uuid

import dace
from dace.sdfg import nodes
from dace.transformation.auto.auto_optimize import make_transients_persistent

from .top_level import add_top_level_map


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


def scratch_once_per_binary(sdfg: dace.SDFG) -> int:
    """Allocate the top-level transients of a CPU build once per loaded binary, and zero those that must start at
    zero in a first state of each call; returns how many transients became persistent.

    Freed at the end of every call, the scratch arrays of a layer (tens of MB) went back to the system (glibc
    trims the heap's top and unmaps large blocks), so each call faulted its pages in again and zeroed them: a
    quarter of a BERT-mini layer's forward+backward (132 -> 78 ms, benchmarks/NOTES.md, Measured choices). A persistent
    array is shared by every call of its binary, which the call paths therefore serialize (module.py, native.cpp).
    """
    before = {
        (g.cfg_id, name) for g in sdfg.all_sdfgs_recursive() for name, desc in g.arrays.items()
        if desc.lifetime == dace.AllocationLifetime.Persistent
    }
    made = make_transients_persistent(sdfg, dace.DeviceType.CPU)
    # the top level only: a nested SDFG's persistent arrays are freed in the program's exit code, which the views
    # would then count as that nested SDFG's code (views/sources.py); those persistent already (auto_optimize's) stay so
    for nested in sdfg.all_sdfgs_recursive():
        if nested is not sdfg:
            for name in made.pop(nested.cfg_id, set()) - {n for g, n in before if g == nested.cfg_id}:
                nested.arrays[name].lifetime = dace.AllocationLifetime.Scope
    zeroed = []
    for node, state in sdfg.all_nodes_recursive():
        if not (isinstance(node, nodes.AccessNode) and node.setzero):
            continue
        owner = state.sdfg
        desc = owner.arrays[node.data]
        if not (desc.transient and desc.lifetime == dace.AllocationLifetime.Persistent):
            continue
        # zeroed once at the start of a call only where nothing repeats its scope (a loop, a nested SDFG)
        if owner is sdfg and state.parent_graph is sdfg:
            node.setzero = False
            zeroed.append(node.data)
        else:
            desc.lifetime = dace.AllocationLifetime.Scope
            made.get(owner.cfg_id, set()).discard(node.data)
    zeroed = list(dict.fromkeys(zeroed))
    if zeroed:
        first = sdfg.add_state_before(sdfg.start_block, "zero_accumulators", is_start_block=True)
        for name in zeroed:
            shape = sdfg.arrays[name].shape
            params = [f"__z{i}" for i in range(len(shape))]
            zeroing = add_top_level_map(
                first,
                f"zero_{name}",
                {p: f"0:{size}" for p, size in zip(params, shape)},
                {},
                "__out = 0",
                {"__out": dace.Memlet(f"{name}[{', '.join(params)}]")},
            )
            # the same nodes in every build of this SDFG, so that a step's picture shows them unchanged (views/graph.py
            # matches nodes by guid)
            for role, node in zip(("tasklet", "entry", "exit"), zeroing):
                node.guid = str(uuid.uuid5(uuid.NAMESPACE_OID, f"{sdfg.name}/zero/{name}/{role}"))
    return sum(len(names) for names in made.values())
