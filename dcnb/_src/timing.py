"""Interleaved timing of several callables, with IPython %timeit's statistics (times in milliseconds)."""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Timing:
    """Milliseconds per call over ``runs`` calls, warm-ups excluded."""

    min: float
    mean: float
    median: float
    stdev: float
    max: float
    runs: int

    @classmethod
    def of(cls, samples_ms: list[float]) -> Timing:
        return cls(
            min=min(samples_ms),
            mean=statistics.fmean(samples_ms),
            median=statistics.median(samples_ms),
            stdev=statistics.stdev(samples_ms) if len(samples_ms) > 1 else 0.0,
            max=max(samples_ms),
            runs=len(samples_ms),
        )


def interleaved(
    fns: dict[str, Callable[[], object]],
    *,
    budget_s: float = 2.0,
    warmup: int = 2,
    min_runs: int = 5,
    max_runs: int = 100,
) -> dict[str, Timing]:
    """Time each callable in rounds, rotating the order every round so that no one always runs first.

    The number of rounds fits ``budget_s`` (at least ``min_runs``): slow steps get fewer iterations.
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    start = time.perf_counter()
    for name in names:
        fns[name]()
    round_s = max(time.perf_counter() - start, 1e-9)
    rounds = max(min_runs, min(max_runs, int(budget_s / round_s)))
    samples: dict[str, list[float]] = {name: [] for name in names}
    enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                t0 = time.perf_counter()
                fns[name]()
                samples[name].append((time.perf_counter() - t0) * 1e3)
    finally:
        if enabled:
            gc.enable()
    return {name: Timing.of(s) for name, s in samples.items()}
