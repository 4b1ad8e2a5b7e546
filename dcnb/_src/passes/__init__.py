"""Every pass dcnb runs over SDFGs, in one ordered list per phase; program, steps and build all take from here.

The phases, in the order a step meets them:

- ``ON_IMPORT``: once, on the forward SDFG DaCe imported from ONNX;
- ``BEFORE_AUTODIFF``: on the forward SDFG about to be differentiated;
- ``AFTER_AUTODIFF``: on the forward and backward SDFGs autodiff returned (some passes on the backward only);
- ``auto_optimize.PIPELINE``: DaCe's auto_optimize, its parts in its order (the ``auto_optimize`` step);
- ``AFTER_AUTO_OPTIMIZE``: after it, within that step;
- ``CPU_BUILD`` / ``CUDA_BUILD``: on the SDFGs about to be compiled. What they return is what runs, what the
  views draw and what a step's counts are taken from.

Every phase and step simplifies through ``simplify.simplify``: DaCe's simplify, with what it drops put back.

Fixes that are not passes (expansions and backward rules of ONNX ops) live with their op family in ``fixes``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import dace

from . import memory_order, schedule, simd_loops, tasklet_code, vecmath
from . import after_autodiff, before_autodiff, broadcast_sums, cuda_build, gradient_writes, lifetimes, on_import
from . import reshape_views

SIDES = ("forward", "backward")


@dataclasses.dataclass(frozen=True)
class Pass:
    """A function that changes an SDFG in place, and the SDFGs of a program it runs on."""

    run: Callable[[dace.SDFG], object]
    sides: tuple[str, ...] = SIDES

    @property
    def name(self) -> str:
        return self.run.__name__


ON_IMPORT = (
    # before lower, which expands the Add of a residual connection into a map
    Pass(on_import.activations_into_norms),
    Pass(on_import.lower),
    Pass(on_import.no_single_point_dimensions),
    Pass(on_import.transposes_into_products),
)

BEFORE_AUTODIFF = (Pass(before_autodiff.split_shared_map_inputs), Pass(before_autodiff.whole_arrays_for_ops))

AFTER_AUTODIFF = (
    Pass(after_autodiff.drop_unread_gradients, ("backward",)),
    Pass(after_autodiff.accumulate_nested_gradients, ("backward",)),
    Pass(broadcast_sums.sums_without_atomics),
    Pass(after_autodiff.numeric_pi, ("backward",)),
    Pass(after_autodiff.float_min_max, ("backward",)),
    Pass(after_autodiff.typed_float_literals),
    Pass(gradient_writes.write_gradients_once, ("backward",)),
    Pass(gradient_writes.write_accumulators_once, ("backward",)),
    Pass(after_autodiff.shared_gradients, ("backward",)),
    Pass(after_autodiff.copied_sums, ("backward",)),
    Pass(after_autodiff.stable_state_labels, ("backward",)),
)

AFTER_AUTO_OPTIMIZE = (Pass(lifetimes.zeroed_transients_per_call),)

CPU_BUILD = (
    Pass(tasklet_code.declarations_in_order),
    Pass(reshape_views.copies_as_views),
    Pass(reshape_views.permutations_as_views),
    Pass(lifetimes.scratch_once_per_binary),
    Pass(vecmath.install),
    Pass(memory_order.apply),
    Pass(schedule.apply),
    Pass(simd_loops.apply),
    Pass(schedule.iteration_sums),
    Pass(schedule.own_element_sums),
)

CUDA_BUILD = (
    Pass(tasklet_code.declarations_in_order),
    Pass(cuda_build.to_gpu),
    Pass(cuda_build.plannable_reductions),
    Pass(cuda_build.size_blocks),
    Pass(lifetimes.persistent_gpu_transients),
    Pass(lifetimes.zeroed_transients_per_call),
    Pass(cuda_build.no_state_syncs),
    # after persistent_gpu_transients: DaCe's make_transients_persistent makes every sum on a GPU atomic again
    Pass(schedule.iteration_sums),
)

BUILD = {"cpu": CPU_BUILD, "cuda": CUDA_BUILD}


def run(phase: tuple[Pass, ...], sdfg: dace.SDFG | None, side: str = "forward") -> None:
    """Run a phase's passes, in order, over ``sdfg`` (one ``side`` of a program); None stays None."""
    if sdfg is None:
        return
    for p in phase:
        if side in p.sides:
            p.run(sdfg)
