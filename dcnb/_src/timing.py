"""Interleaved timing of several callables, with IPython %timeit's statistics (times in milliseconds)."""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from collections.abc import Callable

import torch


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
    warmup: int | dict[str, int] = 2,
    min_runs: int = 5,
    max_runs: int = 100,
    sync: Callable[[], object] | None = None,
) -> dict[str, Timing]:
    """Time each callable in rounds, in the orders of a balanced Latin square (``_orders``): each runs first as
    often as the others, and right after each other one as often as after any: one that always followed the same
    neighbour would always find the caches as that one left them (cold after a slow candidate's traffic, warm with
    the inputs after a fast one's).

    ``warmup`` calls of each (a dict gives each its own count: what an earlier run warmed needs none) are not
    timed. The first timed round also sizes the run: as many rounds as fit ``budget_s``, at least ``min_runs``,
    so slow steps get fewer iterations. ``sync`` (``torch.cuda.synchronize``) ends each timed call where the device
    runs asynchronously, so that a call's time is its work's, not its launches'.
    """
    done = sync or (lambda: None)
    names = list(fns)
    orders = _orders(len(names))
    warmups = warmup if isinstance(warmup, dict) else dict.fromkeys(names, warmup)
    for name in names:
        for _ in range(warmups.get(name, 0)):
            fns[name]()
    done()
    samples: dict[str, list[float]] = {name: [] for name in names}
    enabled = gc.isenabled()
    gc.disable()
    try:
        rounds, r = 1, 0
        while r < rounds:
            for name in (names[i] for i in orders[r % len(orders)]):
                t0 = time.perf_counter()
                fns[name]()
                done()
                samples[name].append((time.perf_counter() - t0) * 1e3)
            if r == 0:
                round_s = max(sum(s[0] for s in samples.values()) / 1e3, 1e-9)
                rounds = max(min_runs, min(max_runs, int(budget_s / round_s)))
            r += 1
    finally:
        if enabled:
            gc.enable()
    return {name: Timing.of(s) for name, s in samples.items()}


def _orders(n: int) -> list[list[int]]:
    """Williams' design for n candidates: n orders (2n where n is odd) in which each candidate holds each position
    equally often and directly follows each other candidate equally often."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(k + shift) % n for k in first] for shift in range(n)]
    return rows if n % 2 == 0 else rows + [row[::-1] for row in rows]


def synchronizer(device: str) -> Callable[[], object] | None:
    """What ends a timed call on ``device`` (``interleaved``'s ``sync``): CUDA kernels run after their launch
    returns."""
    return torch.cuda.synchronize if device == "cuda" else None
