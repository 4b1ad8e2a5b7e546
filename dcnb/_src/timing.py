"""Interleaved timing of several callables, with IPython %timeit's statistics (times in milliseconds), and what
says that a timing is noise rather than a result (``noise``)."""

from __future__ import annotations

import dataclasses
import gc
import os
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
    #: the first and third quartiles: the middle half of the runs lies between them (None where not measured)
    q1: float | None = None
    q3: float | None = None

    @classmethod
    def of(cls, samples_ms: list[float]) -> Timing:
        quartiles = statistics.quantiles(samples_ms, n=4, method="inclusive") if len(samples_ms) > 1 else None
        return cls(
            min=min(samples_ms),
            mean=statistics.fmean(samples_ms),
            median=statistics.median(samples_ms),
            stdev=statistics.stdev(samples_ms) if len(samples_ms) > 1 else 0.0,
            max=max(samples_ms),
            runs=len(samples_ms),
            q1=samples_ms[0] if quartiles is None else quartiles[0],
            q3=samples_ms[0] if quartiles is None else quartiles[2],
        )

    @property
    def spread(self) -> float | None:
        """The interquartile range over the median: 0.1 where the middle half of the runs spans 10% of it."""
        if self.q1 is None or self.q3 is None or self.median <= 0:
            return None
        return (self.q3 - self.q1) / self.median

    def overlaps(self, other: Timing) -> bool:
        """Whether the middle halves of the two runs overlap: which is faster is then within their variation."""
        return None not in (self.q1, self.q3, other.q1, other.q3) and self.q1 <= other.q3 and other.q1 <= self.q3


#: a candidate whose runs' middle half spreads wider than this share of their median makes its step's ratios noise
#: (the ratios are shown to two digits; a few runs far off, a page fault or a timer tick, do not count)
NOISY_SPREAD = 0.25
#: how the views and notes begin what ``noise`` says, so that the history can mark the step's ratio
NOISE_NOTE = "timing is noise"


def noise(timings: dict[str, Timing], *, load: float | None = None, cores: int | None = None) -> tuple[str, ...]:
    """Notes saying why the ratios between ``timings`` may be noise rather than a result; none where nothing does.

    Two things do. Runs that vary widely (their interquartile range over ``NOISY_SPREAD`` of their median): dcnb's
    always (every ratio, and every comparison with another step, reads them), a baseline's where the middle half of
    its runs overlaps dcnb's (a baseline 15x faster than dcnb is so however its runs vary). And a machine busier than
    it has cores (``load``, the 1-minute load average, above ``cores``), where whatever else runs takes turns with
    the candidates.
    """
    notes = []
    dcnb = timings.get("dcnb")
    wide = [
        (name, t.spread)
        for name, t in timings.items()
        if t.spread is not None and t.spread > NOISY_SPREAD and (name == "dcnb" or dcnb is None or t.overlaps(dcnb))
    ]
    if wide:
        which = ", ".join(f"{name} {s:.0%}" for name, s in wide)
        notes.append(
            f"{NOISE_NOTE}: the runs vary more than the ratio can tell apart (interquartile range over median: "
            f"{which}); undo and apply the step again to measure it again"
        )
    if load is not None and cores and load > cores:
        notes.append(
            f"{NOISE_NOTE}: the machine was busy while timing (load average {load:.1f} on {cores} cores); "
            "the ratios may be off: apply the step again when it is idle"
        )
    return tuple(notes)


def load_average() -> float | None:
    """The 1-minute load average, where the system tells it."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


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
