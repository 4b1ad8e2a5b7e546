"""Interleaved timing of several callables, with IPython %timeit's statistics (times in milliseconds), what says
that a timing is noise rather than a result (``noise``), and the baselines a session times each step against
(``Baselines``)."""

from __future__ import annotations

import dataclasses
import gc
import os
import statistics
import time
from collections.abc import Callable, Collection, Iterable

import torch
from torch import nn

from . import structure, verify
from .errors import describe


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


class Baselines:
    """What a session times each step against: PyTorch eager and torch.compile of the user's module (``names``: those
    asked for), made once per session, and the call of forward and backward that the step and they are timed by.

    torch.compile is compiled where it is first timed; where that fails it is dropped from ``names`` and the step
    says why. A baseline's code does not change between steps: only its first timing warms it up."""

    def __init__(
        self,
        names: Iterable[str],
        reference: verify.Reference,
        device: str,
        budget_s: float,
        progress: Callable[[str], None],
    ):
        self.names = tuple(names)
        self._reference = reference
        self._sync = synchronizer(device)
        self._budget_s = budget_s
        self._progress = progress
        self._compiled: nn.Module | None = None
        #: baselines timed before: they need no more warm-up
        self._warmed: set[str] = set()

    def time(self, candidate: nn.Module) -> tuple[dict[str, Timing], tuple[str, ...]]:
        """Time ``candidate`` (a step's compiled module, as "dcnb") and the baselines, interleaved within the budget
        (at least 3 rounds), forward and backward each; with notes where a baseline is missing or the timing is
        noise."""
        notes = []
        module = self._reference.module
        candidates = {"dcnb": candidate}
        if "torch" in self.names:
            candidates["torch"] = module
        if "torch_compile" in self.names:
            compiled, note = self._torch_compiled()
            if compiled is not None:
                candidates["torch_compile"] = compiled
            else:
                notes.append(note)
        # the check just ran the new binary (loaded it, touched its memory): only baselines new to this session
        # are warmed up; few rounds for slow steps (the budget decides)
        timings = self._interleaved(candidates, warm={"dcnb"})
        # rounds far apart, or a machine busier than it has cores: the ratios are noise, and the step says so
        notes.extend(noise(timings, load=load_average(), cores=os.cpu_count()))
        return timings, tuple(notes)

    def time_together(self, candidates: dict[str, nn.Module], at_least_s: float = 0.0) -> dict[str, Timing]:
        """Time ``candidates`` (compiled modules, by name), eager as "torch" and torch.compile as "torch_compile"
        where it is a baseline already compiled, in one interleaved run within the budget (or ``at_least_s`` where
        longer; at least 3 rounds): ratios that each come from a run of their own are minutes apart on a machine whose
        load moves, and these are not. Each candidate is warmed up once (its binary ran long ago)."""
        modules = {**candidates, "torch": self._reference.module}
        if "torch_compile" in self.names and self._compiled is not None:
            modules["torch_compile"] = self._compiled
        return self._interleaved(modules, budget_s=max(self._budget_s, at_least_s))

    def _interleaved(
        self, modules: dict[str, nn.Module], warm: Collection[str] = (), budget_s: float | None = None
    ) -> dict[str, Timing]:
        """``modules`` (by name) timed in one interleaved run within the budget (the steps' unless ``budget_s``), at
        least 3 rounds; each warmed up once first, but the baselines timed before and those ``warm`` names (just
        run)."""
        calls = {name: self.call(fn) for name, fn in modules.items()}
        warmup = {name: 0 if name in self._warmed or name in warm else 1 for name in calls}
        budget_s = self._budget_s if budget_s is None else budget_s
        with verify.preserved(self._reference.module):
            timings = interleaved(calls, budget_s=budget_s, warmup=warmup, min_runs=3, sync=self._sync)
        self._warmed |= set(calls) & set(self.names)
        return timings

    def call(self, fn: Callable[..., object]) -> Callable[[], None]:
        """A call of ``fn`` on copies of the example inputs, backpropagating the reference's upstream gradients
        where there is a backward: what a step and each baseline are timed by."""
        reference = self._reference
        upstream = reference.upstream
        inputs = [t.detach().clone().requires_grad_(upstream is not None and t.is_floating_point())
                  for t in reference.inputs]

        def call() -> None:
            outputs = structure.leaves(reference.call.invoke(fn, inputs))
            if upstream is not None:
                pairs = [(o, g) for o, g in zip(outputs, upstream) if g is not None and o.requires_grad]
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
                for t in inputs:
                    t.grad = None

        return call

    def _torch_compiled(self) -> tuple[nn.Module | None, str]:
        if self._compiled is None:
            self._progress("compiling the torch.compile baseline")
            try:
                compiled = torch.compile(self._reference.module)
                self.call(compiled)()
                self._compiled = compiled
            except Exception as e:
                self.names = tuple(b for b in self.names if b != "torch_compile")
                return None, f"torch.compile baseline unavailable: {describe(e)}"
            finally:
                self._progress("timing")  # the step's timing, which the session announced, starts only now
        return self._compiled, ""
