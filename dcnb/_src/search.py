"""Search: dcnb finds the recipe. A beam search over sequences of actions from a session's current step, each
candidate built, checked against PyTorch and timed exactly as a step is (``Session._advance``), without touching the
session's history; the best then becomes ordinary steps (``Session.apply`` for each of its entries).

Why a beam search: a recipe is a short sequence (the best ones known are one to three actions long), the actions that
match change with each step taken (``expand`` opens what ``map_fusion`` then fuses; ``tasklet_fusion`` leaves nothing
for ``map_fusion``), and which sequence wins changes with the model, so only trying tells. Each candidate costs a
compile, a check and a timing (seconds, not microseconds), which rules out search methods that need thousands of
samples; a beam keeps the ``beam`` best candidates of each length and extends only those, so that a search of depth d
tries at most ``beam * actions * d`` candidates, and the most promising first when the budget cuts it short. With no
depth given, levels go on while the budget lasts: at the test sizes a search reached depth 3 in 2-6 of its 10 minutes
and left the rest unused. An action that matches at a few places (2 to ``places``) is also tried at each place alone,
after every action of its level has been tried whole: applied everywhere it may help at one place and cost at another.
Where an action matches at more, one place at a time would be as many candidates, each a compile, and combinations of
places far more: the whole action stands for them. A candidate's compiled SDFGs name their content (the build cache's
key): a sequence that ends where another ended is recorded as that one's, and not checked, timed or extended again.
Builds are cached by content, so a second search of the same module, in this process or another, compiles nothing it
compiled before.

Each candidate's time over eager's comes from a timing run of its own, and those runs are minutes apart on a machine
whose load moves (eager's own time moved 4.7x under load). So the search keeps the ``FINALISTS`` best candidates'
binaries and at its end times them and eager again in one interleaved run, and those the run cannot tell from the
fastest (``RETIMED``) in up to two more; the best on time is the fastest there.
The same holds within a level: a candidate's own run may put it behind the beam when it was not (ConvNeXt-T's
``channels_last``, on the cores where it led the best recipe known, fell outside the beam and was never extended). So
where the candidates just past the beam cannot be told from its last by their own timings (their runs' middle halves
overlap, over each run's eager median, or their timing was noise), those and the beam are timed in one interleaved
run, and that run chooses the beam (``CONTENDERS``, ``_contenders``).
What the best is to be at or below is always in that run, whatever its own timing said: the start, ``REFERENCE``
(DaCe's heuristics, where the search tries it: its first action, before those the budget may not reach) and the
recipes it is given (a kept recipe, say), which it builds first and may extend. A search of ResNet left
``auto_optimize`` out of that run, its own timing minutes earlier having put it behind three others, and ended 3%
slower than it in the benchmark's run after.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import math
import os
import random
import statistics
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from . import actions, alone, events, verify, workdir
from . import build as builder
from .errors import DcnbError, StepError, describe
from .recipe import Entry
from .record import MIB, Row, Step, Table
from .timing import NOISE_NOTE

if TYPE_CHECKING:
    from .session import Session, _State

OBJECTIVES = ("time", "memory")
#: how many candidates of each length a search keeps to extend, by default (sequences get as long as the budget lasts)
BEAM = 3
#: how many of the best candidates (the start besides) are timed again together at the end
FINALISTS = 3
#: how many more interleaved runs the candidates still tied with the fastest get (the middle half of their times
#: overlapping its): one run put MobileNetV2's start 0.5% ahead of auto_optimize, all of them flagged noisy, and the
#: run after it 6% behind
RETIMED = 2
#: the share of a search's budget each of those runs may take, where that is longer than a step's timing: it decides
#: the best, and a step's budget gave the BERT-base and GPT-2 blocks at full size (0.4 s a call) 3 rounds each, whose
#: best was 5-6% slower than the kept recipe in a run of 9 rounds right after
CLOSING = 0.03
#: up to how many candidates past a level's beam are timed with it to choose it, where their own timings cannot tell
#: them from the beam's last
CONTENDERS = 2
#: up to how many places an action may match, by default, for the search to try it at each of them alone too
PLACES = 3
#: the one-action candidate from the start that is always timed with the finalists: DaCe's heuristics
REFERENCE = Entry("auto_optimize")

#: the table's columns; a failed candidate's row ends in its reason
COLUMNS = (
    "#", "from", "recipe", "ok", "interm. MiB", "compile s", "dcnb ms", "torch ms", "torch.compile ms", "vs torch"
)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One sequence of actions a search tried from its start (``recipe``: the entries after the start's recipe)."""

    #: its place in the order the search tried candidates (0: the start itself, as the session held it)
    index: int
    recipe: tuple[Entry, ...]
    #: the candidate it extends (None for the start)
    parent: int | None
    ok: bool
    #: why it failed (the step's error: it matched nothing, did not compile, broke correctness)
    error: str | None = None
    #: its record, as a step of that recipe would be (None where it failed)
    step: Step | None = None
    #: wall seconds its build, check and timing took
    seconds: float = 0.0
    #: an earlier candidate that compiled to the same SDFGs: this one stands for it (it is not checked, timed or
    #: extended again)
    same_as: int | None = None
    #: dcnb's time over eager's in the finalists' run (all timed together at the search's end); None where it was
    #: not a finalist or there was no such run
    together: float | None = None
    #: dcnb's time over torch.compile's in that run (None where torch.compile was not timed)
    together_compile: float | None = None
    #: dcnb's time over eager's in the run that chose its level's beam (None where it was not in such a run)
    ranked: float | None = None

    def _median(self, name: str) -> float | None:
        if self.step is None or name not in self.step.timings:
            return None
        return self.step.timings[name].median

    @property
    def dcnb_ms(self) -> float | None:
        return self._median("dcnb")

    @property
    def torch_ms(self) -> float | None:
        return self._median("torch")

    @property
    def torch_compile_ms(self) -> float | None:
        return self._median("torch_compile")

    @property
    def ratio(self) -> float | None:
        """dcnb's median time over eager's, each from the candidate's own interleaved run (below 1: faster)."""
        if self.dcnb_ms is None or not self.torch_ms:
            return None
        return self.dcnb_ms / self.torch_ms

    @property
    def intermediate_bytes(self) -> int | None:
        return None if self.step is None else self.step.intermediate_bytes

    @property
    def title(self) -> str:
        """The recipe after the start, as the history names its steps: ``tasklet_fusion, vectorization``."""
        return ", ".join(e.title for e in self.recipe) or "start"

    def score(self, objective: str) -> tuple[float, ...]:
        """What the search minimises: time, dcnb's time relative to eager's (from the finalists' run where it was
        timed there, else its own; its own median where eager was not timed); memory, the intermediate bytes, then
        time."""
        time_ = next((t for t in (self.together, self.ratio, self.dcnb_ms) if t is not None), None)
        time_ = math.inf if time_ is None else time_
        if objective == "memory":
            memory = self.intermediate_bytes
            return (math.inf if memory is None else float(memory), time_)
        return (time_,)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable row of the table."""
        return {
            "index": self.index,
            "recipe": [e.to_json() for e in self.recipe],
            "parent": self.parent,
            "ok": self.ok,
            "error": self.error,
            "dcnb_ms": self.dcnb_ms,
            "torch_ms": self.torch_ms,
            "torch_compile_ms": self.torch_compile_ms,
            "ratio": self.ratio,
            "intermediate_bytes": self.intermediate_bytes,
            "compile_seconds": None if self.step is None else self.step.compile_seconds,
            "seconds": self.seconds,
            "same_as": self.same_as,
            "together": self.together,
            "together_compile": self.together_compile,
            "ranked": self.ranked,
        }

    def cells(self) -> tuple[str, ...]:
        head = (str(self.index), "" if self.parent is None else str(self.parent), self.title)
        if not self.ok:
            return (*head, "no", self.error or "")
        if self.step is None:
            return (*head, "yes", f"the SDFGs of #{self.same_as}: not checked or timed again")
        step = self.step
        speedup = step.speedup()
        # a ratio that the candidate's notes call noise says so, as the history does
        noise = " (noise)" if speedup is not None and any(n.startswith(NOISE_NOTE) for n in step.notes) else ""
        return (
            *head,
            "yes",
            _num(None if step.intermediate_bytes is None else step.intermediate_bytes / MIB, "{:.2f}"),
            _num(step.compile_seconds, "{:.1f}"),
            _num(self.dcnb_ms, "{:.3f}"),
            _num(self.torch_ms, "{:.3f}"),
            _num(self.torch_compile_ms, "{:.3f}"),
            _num(speedup, "{:.2f}x") + noise,
        )


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """What ``Session.search`` tried and found: every candidate in the order tried (``candidates``; the start is
    the first), the best on the objective, and the steps it became in the session's history."""

    objective: str
    budget: float
    beam: int
    #: the longest sequence it was to try (None: as long as the budget lasted)
    depth: int | None
    seed: int
    #: up to how many places an action matched for it to be tried at each alone too (0: never)
    places: int
    #: the session's recipe where the search started; each candidate's recipe follows it
    start_recipe: list[dict[str, Any]]
    candidates: tuple[Candidate, ...]
    best: Candidate
    #: the steps the best's recipe became in the history, applied after the search (empty where the start is best)
    steps: tuple[Step, ...]
    #: wall seconds the exploration took (the replay of the best not included)
    seconds: float
    #: compiles the exploration made (0: every binary came from the build cache)
    builds: int
    #: why it stopped: "budget spent", "depth reached" or "nothing left to extend"
    stopped: str
    #: where the candidates were compiled: this machine's cores, or a Dask cluster's workers
    where: str = "this machine"
    #: where replaying the best failed (it holds on its own run: this is rare), why; the session stays at the last
    #: good step then
    replay_error: str | None = None
    #: for each recipe the search was given, the index of its last candidate (the recipe's end, or where it failed;
    #: None where the budget was spent before it began)
    known: tuple[int | None, ...] = ()

    @property
    def start(self) -> Candidate:
        return self.candidates[0]

    @property
    def recipe(self) -> list[dict[str, Any]]:
        """The best's whole recipe, the start's included: what ``dcnb.replay`` takes."""
        return [*self.start_recipe, *(e.to_json() for e in self.best.recipe)]

    def table(self) -> Table:
        """Every candidate in a row, the best marked (the row the views mark as current)."""
        rows = tuple(Row(c.cells(), ok=c.ok, current=c.index == self.best.index) for c in self.candidates)
        return Table("search", COLUMNS, rows, caption=self.headline, left=(2,))

    @property
    def headline(self) -> str:
        tried = len(self.candidates) - 1
        failed = sum(not c.ok for c in self.candidates)
        return (
            f"search for {self.objective} (beam {self.beam}, depth {self.depth or 'open'}, places {self.places}, "
            f"seed {self.seed}): {tried} candidates ({failed} failed) in {self.seconds:.0f} s of {self.budget:g} s, "
            f"{self.builds} compiles on {self.where}; stopped: {self.stopped}"
        )

    def summary(self) -> str:
        """The best against the start, in one line."""
        best, start = self.best, self.start
        if best.index == start.index:
            return "best: the start (no candidate did better)"
        if self.objective == "memory":
            measured = f"{_mib(best.intermediate_bytes)} intermediate MiB against {_mib(start.intermediate_bytes)}"
        elif best.together is not None and start.together is not None:  # eager's time over dcnb's, as the table
            measured = f"{1 / best.together:.2f}x vs torch against {1 / start.together:.2f}x, timed together"
        elif best.ratio is not None and start.ratio is not None:
            measured = f"{1 / best.ratio:.2f}x vs torch against {1 / start.ratio:.2f}x"
        else:
            measured = f"{_num(best.dcnb_ms, '{:.3f}')} ms against {_num(start.dcnb_ms, '{:.3f}')} ms"
        return f"best: #{best.index} {best.title}: {measured} at the start"

    def points(self) -> list[dict[str, Any]]:
        """Each candidate that was timed, as a plot of time against intermediate memory draws it: its ``index``,
        ``title``, ``time`` (dcnb's over eager's, or dcnb's ms where eager was not timed: ``unit``), ``bytes``,
        whether it is on the ``front`` (no other is as fast with as little stored, and better in one) and the
        ``best``."""
        timed = [c for c in self.candidates if c.ok and c.dcnb_ms is not None]
        relative = all(c.ratio is not None for c in timed)
        # a finalist at its time in the finalists' run, which chose the best
        at = {c.index: (c.score("time")[0] if relative else c.dcnb_ms, c.intermediate_bytes or 0) for c in timed}

        def on_front(t: float, b: int) -> bool:
            return not any(u <= t and v <= b and (u, v) != (t, b) for u, v in at.values())

        return [
            {
                "index": c.index,
                "title": c.title,
                "time": at[c.index][0],
                "unit": "x eager" if relative else "ms",
                "bytes": at[c.index][1],
                "front": on_front(*at[c.index]),
                "best": c.index == self.best.index,
            }
            for c in timed
        ]

    def as_text(self) -> str:
        lines = self.table().as_text()
        lines.append(self.summary())
        if self.replay_error:
            lines.append(f"replaying the best failed: {self.replay_error}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON: the parameters, every candidate, the best's index and recipe, the steps it became."""
        return {
            "objective": self.objective,
            "budget": self.budget,
            "beam": self.beam,
            "depth": self.depth,
            "seed": self.seed,
            "places": self.places,
            "start_recipe": self.start_recipe,
            "candidates": [c.to_dict() for c in self.candidates],
            "best": self.best.index,
            "recipe": self.recipe,
            "steps": [s.to_dict() for s in self.steps],
            "seconds": self.seconds,
            "builds": self.builds,
            "stopped": self.stopped,
            "where": self.where,
            "replay_error": self.replay_error,
            "known": list(self.known),
        }

    def __repr__(self) -> str:
        return self.as_text()

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.as_text())


def search(
    session: Session,
    budget: float,
    objective: str = "time",
    actions_: Sequence[str | dict[str, Any]] | None = None,
    beam: int = BEAM,
    depth: int | None = None,
    seed: int = 0,
    cluster: Any = None,
    recipes: Sequence[Sequence[str | dict[str, Any]]] = (),
    places: int = PLACES,
) -> SearchResult:
    """Beam search from the session's current step (``Session.search`` documents it); the best candidate's entries
    are then applied as ordinary steps."""
    budget, objective, beam, depth = _checked(budget, objective, beam, depth, seed, places)
    wanted = _entries(session, actions_)
    start_state = session._states[-1]
    given = _recipes(session, recipes, start_state.applied)
    rng = random.Random(seed)
    start = Candidate(0, (), None, True, step=start_state.step)
    tried = [start]
    tiebreak = {0: rng.random()}
    seen = {_content(start_state): 0}
    frontier: list[tuple[Candidate, _State]] = [(start, start_state)]
    # the best candidates so far with their states (binaries), for the finalists' run
    finalists: list[tuple[Candidate, _State]] = []
    # what the best is to be at or below, timed in the finalists' run whatever their own timing: the given recipes'
    # ends and the reference, by index
    rivals: dict[int, tuple[Candidate, _State]] = {}
    known: list[int | None] = []
    # a candidate's time over eager's in the run that chose its level's beam, by index
    ranked: dict[int, float] = {}
    began = time.perf_counter()
    deadline = began + budget
    stopped = "depth reached"
    report = session._report

    def leading() -> str:
        leader = min(
            (c for c in tried if c.ok and c.same_as is None), key=lambda c: (c.score(objective), tiebreak[c.index])
        )
        return _leading(leader)

    def saying(index: int) -> None:
        left = max(0.0, deadline - time.perf_counter())
        session._report = _prefixed(report, f"search, candidate {index} ({left:.0f} s left; best so far {leading()})")

    try:
        with events.count() as counted, _compiles(cluster) as (compiles, ahead, where):
            # the states the given recipes' candidates made, by index, while they are built
            built = {0: start_state}
            for entries in given:
                # one entry after the other (each builds on the last), every prefix a candidate of the table
                parent, state, last = start, start_state, None if entries else 0
                for entry in entries:
                    if time.perf_counter() >= deadline:
                        break
                    saying(len(tried))
                    child, made = _end(session, _begin(session, compiles, parent, state, entry, len(tried), seen))
                    tiebreak[child.index] = rng.random()
                    tried.append(child)
                    session._report = report
                    last = child.index
                    made = built.get(child.same_as, made)
                    if made is None:
                        break
                    built[child.index] = made
                    parent, state = child, made
                else:
                    end = parent if parent.same_as is None else tried[parent.same_as]
                    rivals[end.index] = (end, state)
                known.append(last)
            built.clear()  # the prefixes' binaries go; the ends stay with the rivals
            for level in itertools.count() if depth is None else range(depth):
                # the given recipes' ends compete with the first level's candidates to be extended
                children = [r for i, r in rivals.items() if i != 0] if level == 0 else []
                # every action whole first (the reference first of all), then at each of its places alone where
                # it matches at few
                ordered = _first_level(wanted) if level == 0 else wanted
                tries = itertools.chain(
                    ((p, s, e) for p, s in frontier for e in _matching(session, s, ordered)),
                    ((p, s, e) for p, s in frontier for e in _placed(s, wanted, places)),
                )
                flight: collections.deque[_Flight] = collections.deque()
                while True:
                    # the next candidates begin (transformed, their compiles started) while the first is finished:
                    # ``ahead`` of them, as many as the compiles' room
                    while len(flight) <= ahead and time.perf_counter() < deadline:
                        nxt = next(tries, None)
                        if nxt is None:
                            break
                        index = len(tried) + len(flight)
                        saying(index)
                        flight.append(_begin(session, compiles, *nxt, index, seen))
                    if not flight:
                        break
                    first = flight.popleft()
                    saying(first.index)
                    child, made = _end(session, first)
                    tiebreak[child.index] = rng.random()
                    if child.parent == 0 and child.recipe == (REFERENCE,):
                        pool = {c.index: (c, s) for c, s in [*children, *rivals.values()]}
                        reference = (child, made) if made is not None else pool.get(child.same_as)
                        if reference is not None:
                            rivals[reference[0].index] = reference
                    if made is not None:
                        children.append((child, made))
                        finalists.append((child, made))
                        finalists.sort(key=lambda c: (c[0].score(objective), tiebreak[c[0].index]))
                        del finalists[FINALISTS:]
                    tried.append(child)
                    session._report = report
                if time.perf_counter() >= deadline:
                    stopped = "budget spent"
                if not children:
                    stopped = stopped if stopped == "budget spent" else "nothing left to extend"
                    break
                children.sort(key=lambda c: (c[0].score(objective), tiebreak[c[0].index]))
                if stopped != "budget spent" and (depth is None or level < depth - 1):
                    children = _beam_chosen(session, children, beam, objective, CLOSING * budget, ranked, tiebreak)
                frontier = children[:beam]  # the others' states (their SDFGs and binaries) go
                if stopped == "budget spent":
                    break
    finally:
        session._report = report
    tried = [dataclasses.replace(c, ranked=ranked[c.index]) if c.index in ranked else c for c in tried]
    timed_together = {c.index: (c, s) for c, s in [(start, start_state), *rivals.values(), *finalists]}
    together = _together(session, list(timed_together.values()), CLOSING * budget) if objective == "time" else {}
    if together:
        tried = [
            dataclasses.replace(c, together=together[c.index][0], together_compile=together[c.index][1])
            if c.index in together else c
            for c in tried
        ]
        best = min((c for c in tried if c.index in together), key=lambda c: (c.together, tiebreak[c.index]))
    else:
        # a candidate that compiled to an earlier one's SDFGs stands for that one (whose recipe is no longer)
        ok = [c for c in tried if c.ok and c.same_as is None]
        best = min(ok, key=lambda c: (c.score(objective), tiebreak[c.index]))
    seconds = time.perf_counter() - began
    session._progress(f"search done: {len(tried) - 1} candidates in {seconds:.0f} s; applying the best")
    steps, replay_error = _replay(session, best.recipe)
    return SearchResult(
        objective=objective,
        budget=budget,
        beam=beam,
        depth=depth,
        seed=seed,
        places=places,
        start_recipe=[e.to_json() for e in start_state.applied],
        candidates=tuple(tried),
        best=best,
        steps=tuple(steps),
        seconds=seconds,
        builds=counted["build"],
        stopped=stopped,
        where=where,
        replay_error=replay_error,
        known=tuple(known),
    )


def _beam_chosen(
    session: Session,
    children: list[tuple[Candidate, _State]],
    beam: int,
    objective: str,
    seconds: float,
    ranked: dict[int, float],
    tiebreak: dict[int, float],
) -> list[tuple[Candidate, _State]]:
    """A level's candidates (ordered by their own timings) in the order their beam is taken from: where some past
    the beam cannot be told from its last (``_contenders``), those and the beam as one interleaved run of them orders
    them (each one's ratio there into ``ranked``), ahead of the rest."""
    contenders = _contenders(children, beam, objective)
    if not contenders:
        return children
    ratios = _together(session, contenders, seconds, retimed=0, which="candidates the beam is chosen from")
    if not ratios:
        return children
    ranked.update((index, ratio) for index, (ratio, _) in ratios.items())
    head = sorted(contenders, key=lambda c: (ratios[c[0].index][0], tiebreak[c[0].index]))
    return [*head, *(c for c in children if c[0].index not in ratios)]


def _contenders(children: list[tuple[Candidate, _State]], beam: int, objective: str) -> list[tuple[Candidate, _State]]:
    """The beam of ``children`` (ordered by their own timings) and up to ``CONTENDERS`` after it that their own
    timings cannot tell from its last; none where there are none such, or the objective is memory (whose ties
    time breaks as it is)."""
    if objective != "time" or len(children) <= beam:
        return []
    last = children[beam - 1][0]
    tied = [c for c in children[beam:] if _tied(c[0], last)][:CONTENDERS]
    return [*children[:beam], *tied] if tied else []


def _tied(candidate: Candidate, other: Candidate) -> bool:
    """Whether ``candidate``'s own timing cannot tell it from ``other``'s: the middle halves of their runs overlap,
    each over its run's eager median, or its timing was noise."""
    if candidate.step is None or other.step is None:
        return False
    if any(n.startswith(NOISE_NOTE) for n in candidate.step.notes):
        return True
    spans = []
    for step in (candidate.step, other.step):
        dcnb, eager = step.timings.get("dcnb"), step.timings.get("torch")
        if dcnb is None or eager is None or None in (dcnb.q1, dcnb.q3) or not eager.median:
            return False
        spans.append((dcnb.q1 / eager.median, dcnb.q3 / eager.median))
    (low, high), (other_low, other_high) = spans
    return low <= other_high and other_low <= high


def _together(
    session: Session,
    finalists: list[tuple[Candidate, _State]],
    seconds: float = 0.0,
    retimed: int = RETIMED,
    which: str = "best candidates",
) -> dict[int, tuple[float, float | None]]:
    """The finalists' times over eager's and over torch.compile's (candidate index -> the two ratios; the second
    None where torch.compile is not a baseline) from one interleaved run of them all, and up to ``retimed`` more of
    those still tied with the fastest (each ratio then the geometric mean of its runs'), each run ``seconds`` long
    or a step's timing where that is longer; none where fewer than two are timed or eager is not among the
    session's baselines."""
    timed = [(c, state) for c, state in finalists if c.dcnb_ms is not None]
    if len(timed) < 2 or not session._timed or "torch" not in session._baselines.names:
        return {}
    modules = {str(c.index): session._dcnb_module(state.runner) for c, state in timed}
    ratios: dict[str, list[tuple[float, float | None]]] = {name: [] for name in modules}
    running = list(modules)
    for _ in range(1 + retimed):
        session._progress(f"timing the {len(running)} {which} together")
        events.emit("timed together")
        with verify.preserved(session._module, session.training), alone.timing():
            timings = session._baselines.time_together({name: modules[name] for name in running}, seconds)
        eager = timings["torch"].median
        compiled = timings["torch_compile"].median if "torch_compile" in timings else None
        for name in running:
            median = timings[name].median
            ratios[name].append((median / eager, None if not compiled else median / compiled))
        fastest = timings[min(running, key=lambda name: timings[name].median)]
        running = [name for name in running if timings[name].overlaps(fastest)]
        if len(running) < 2:
            break
    return {int(name): (_mean(r for r, _ in runs), _mean(c for _, c in runs)) for name, runs in ratios.items()}


def _mean(ratios: Iterable[float | None]) -> float | None:
    """The geometric mean of ratios (None where one is missing)."""
    ratios = list(ratios)
    return None if None in ratios else statistics.geometric_mean(ratios)


@contextlib.contextmanager
def _compiles(cluster: Any) -> Iterator[tuple[builder.Compiles, int, str]]:
    """Where a search's compiles run, how many candidates begin ahead of the one being finished, and the words
    for it: this machine's cores (a candidate's two compiles at a time per two cores), or a Dask cluster's."""
    if cluster is None:
        cores = os.cpu_count() or 1
        with builder.compiling(at_once=max(2, cores)) as compiles:
            yield compiles, max(1, cores // 2), f"this machine's {cores} cores"
        return
    from . import cluster as dask_cluster

    client = dask_cluster.client(cluster)
    threads = dask_cluster.threads(client)
    if not threads:
        raise DcnbError(f"the Dask cluster at {client.scheduler.address} has no workers to compile on")
    with dask_cluster.DaskCompiles(client, builder.compile_timeout()) as compiles:
        yield compiles, max(1, threads // 2), f"a Dask cluster of {threads} worker threads"


@dataclasses.dataclass
class _Flight:
    """A candidate begun: its compiles under way (``begun``), or already decided (``candidate``: it failed, or it
    compiled to an earlier one's SDFGs)."""

    index: int
    recipe: tuple[Entry, ...]
    parent: int
    seconds: float
    begun: Any = None
    candidate: Candidate | None = None


def _begin(
    session: Session,
    compiles: builder.Compiles,
    parent: Candidate,
    state: _State,
    entry: Entry,
    index: int,
    seen: dict[tuple[str | None, ...], int],
) -> _Flight:
    """``entry`` applied to ``state`` as ``Session.apply`` applies a step, up to its compiles (``Session._begin``),
    kept out of the history; a failure is the candidate's reason, never raised (an interrupt is). Where it makes
    the SDFGs of a candidate in ``seen`` (their content -> its index), it stands for that one."""
    recipe = (*parent.recipe, entry)
    session._progress(f"trying {', '.join(e.title for e in recipe)}")
    started = time.perf_counter()
    try:
        with verify.preserved(session._module, session.training), workdir.untouched():
            begun = session._begin(state, entry, len(session._history), compiles)
    except Exception as e:
        seconds = time.perf_counter() - started
        failed = Candidate(index, recipe, parent.index, False, error=_reason(entry, e), seconds=seconds)
        return _Flight(index, recipe, parent.index, seconds, candidate=failed)
    seconds = time.perf_counter() - started
    # in build order (the backward, then the forward), as a state's compiled SDFGs are the other way round
    content = tuple(reversed(begun.building.started.names))
    if content in seen:
        same = Candidate(index, recipe, parent.index, True, seconds=seconds, same_as=seen[content])
        return _Flight(index, recipe, parent.index, seconds, candidate=same)
    seen[content] = index
    return _Flight(index, recipe, parent.index, seconds, begun=begun)


def _end(session: Session, flight: _Flight) -> tuple[Candidate, _State | None]:
    """A begun candidate's build waited for, checked and timed (``Session._end``)."""
    if flight.candidate is not None:
        return flight.candidate, None
    started = time.perf_counter()
    made, error = None, None
    try:
        with verify.preserved(session._module, session.training), workdir.untouched():
            made = session._end(flight.begun)
    except Exception as e:
        error = _reason(flight.recipe[-1], e)
    seconds = flight.seconds + time.perf_counter() - started
    if made is None:
        return Candidate(flight.index, flight.recipe, flight.parent, False, error=error, seconds=seconds), None
    return Candidate(flight.index, flight.recipe, flight.parent, True, step=made.step, seconds=seconds), made


def _reason(entry: Entry, e: Exception) -> str:
    """Why a candidate failed: the step's error (it matched nothing, did not compile, broke correctness); a
    transformation that crashes fails its candidate, not the search."""
    return str(e) if isinstance(e, DcnbError) else f"{entry.name} raised {describe(e)}"


def _replay(session: Session, recipe: tuple[Entry, ...]) -> tuple[list[Step], str | None]:
    """The best's entries applied as ordinary steps (the build cache holds their binaries)."""
    steps = []
    for entry in recipe:
        step = session.apply(entry.name, where=entry.where, **entry.options)
        steps.append(step)
        if not step.ok:
            return steps, f"step {step.index} ({step.title}): {step.error}"
    return steps, None


def _matching(session: Session, state: _State, wanted: list[Entry]) -> list[Entry]:
    """The entries of ``wanted`` whose action matches somewhere in ``state``, in ``wanted``'s order."""
    from .session import _safe_count, _targets

    found = []
    for entry in wanted:
        action = actions.get(entry.name)
        if sum(_safe_count(action, s, entry.where, entry.options) for s in _targets(action, state)):
            found.append(entry)
    return found


def _first_level(wanted: list[Entry]) -> list[Entry]:
    """``wanted`` in the order a first level tries them: ``REFERENCE`` first where it is among them, what the best is
    to be at or below and what a user gets without a search (in its registry's order it came fifth and more, and a
    600-s search of the BERT encoder at full size, 150 s a candidate, never reached it: its best was 5% behind
    ``auto_optimize``); then the actions that lay out what the library nodes read (``Action.layout``), whose
    kernels are most of a step at full size (ResNet-50's convolutions: 843 of 1020 ms) and which their layout
    chooses. ``channels_last`` was in the best recipes of the full-size searches of ResNet-50 and MobileNetV2, ninth
    and tenth of their candidates in the registry's order, which a budget reaches at 13-20 s a candidate and not at
    the 60-200 s of EfficientNet-B0's, ConvNeXt-T's or ViT-B/16's."""
    return sorted(wanted, key=lambda e: (e != REFERENCE, not actions.get(e.name).layout))


def _placed(state: _State, wanted: list[Entry], most: int) -> list[Entry]:
    """Each entry of ``wanted`` without places of its own, once for each place its action matches in ``state``
    (``where`` its labels), where it matches at 2 to ``most`` places."""
    from .session import _safe_places, _targets

    found = []
    for entry in wanted:
        action = actions.get(entry.name)
        if entry.where is not None or action.places is None:
            continue
        bound = [b for sdfg in _targets(action, state) for b in _safe_places(action, sdfg, None, entry.options)]
        # a place bound alike on both sides is one: its labels apply it on both
        labels = list(dict.fromkeys(b.labels for b in bound))
        if 2 <= len(labels) <= most:
            found.extend(dataclasses.replace(entry, where=where) for where in labels)
    return found


def _content(state: _State) -> tuple[str | None, ...]:
    """What a state compiled to: its SDFGs' names end in their build keys (the SDFG's hash and everything else that
    makes the binary)."""
    return tuple(None if s is None else s.name for s in state.compiled)


def _checked(
    budget: Any, objective: Any, beam: Any, depth: Any, seed: Any, places: Any
) -> tuple[float, str, int, int | None]:
    number = isinstance(budget, (int, float)) and not isinstance(budget, bool)
    if not (number and budget > 0 and not math.isnan(budget)):
        raise DcnbError(f"search's budget must be a number of seconds above 0, not {budget!r}")
    if objective not in OBJECTIVES:
        raise DcnbError(f"search's objective must be {' or '.join(map(repr, OBJECTIVES))}, not {objective!r}")
    for name, value in (("beam", beam), ("depth", 1 if depth is None else depth)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DcnbError(f"search's {name} must be a whole number, 1 or more, not {value!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise DcnbError(f"search's seed must be a whole number, not {seed!r}")
    if not isinstance(places, int) or isinstance(places, bool) or places < 0:
        raise DcnbError(f"search's places must be a whole number, 0 or more, not {places!r}")
    return float(budget), objective, beam, depth


def _entries(session: Session, given: Sequence[str | dict[str, Any]] | None) -> list[Entry]:
    """The actions a search tries, as recipe entries: every action offered on the session's device by default, once
    per options it is searched with (``Action.searched``: map_tiling's tile sizes); a name, or a recipe entry
    (``{"name": ..., "options": ...}``) to try an action with options."""
    if given is None:
        offered = [a for a in actions.REGISTRY.values() if session.device in a.devices]
        return [Entry(a.name, dict(options)) for a in offered for options in a.searched]
    if isinstance(given, (str, dict)) or not isinstance(given, Sequence):
        raise DcnbError(f"search's actions must be a list of action names, not {given!r}")
    entries = _parsed(session, given, "search's actions", at_start=True)
    if not entries:
        raise DcnbError("search's actions is empty: name at least one action to try (None tries them all)")
    return entries


def _recipes(
    session: Session, given: Sequence[Sequence[str | dict[str, Any]]], start: tuple[Entry, ...]
) -> list[list[Entry]]:
    """The recipes a search builds first, as entries from its start: one that begins with the start's own recipe
    (a whole recipe, as ``dcnb.replay`` takes and ``Session.recipe`` gives) goes on from there."""
    if isinstance(given, (str, dict)) or not isinstance(given, Sequence):
        raise DcnbError(f"search's recipes must be a list of recipes (each a list of steps), not {given!r}")
    recipes = []
    for i, recipe in enumerate(given):
        if isinstance(recipe, (str, dict)) or not isinstance(recipe, Sequence):
            raise DcnbError(f'search\'s recipe {i} is not a list of steps like [{{"name": "map_fusion"}}]: {recipe!r}')
        entries = _parsed(session, recipe, f"search's recipe {i}", at_start=False)
        recipes.append(entries[len(start):] if tuple(entries[: len(start)]) == start else entries)
    return recipes


def _parsed(session: Session, given: Sequence[str | dict[str, Any]], what: str, at_start: bool) -> list[Entry]:
    """``given`` (action names or recipe entries) as entries of actions offered on the session's device with their
    options (and, ``at_start``, places where the session's current step has them); a DcnbError, beginning with
    ``what``, names the first that is not."""
    entries = []
    for i, item in enumerate(given):
        entry = Entry(item) if isinstance(item, str) else Entry.from_json(item, i)
        if entry.name not in actions.REGISTRY:
            raise DcnbError(f"{what}: unknown action {entry.name!r}; the actions are: {', '.join(actions.REGISTRY)}")
        action = actions.REGISTRY[entry.name]
        if session.device not in action.devices:
            raise DcnbError(
                f"{what}: {entry.name} is offered on {', '.join(action.devices)} only; this session runs on "
                f"{session.device}"
            )
        _check_options(session, action, entry, what, at_start)
        entries.append(entry)
    return entries


def _check_options(session: Session, action: actions.Action, entry: Entry, what: str, at_start: bool) -> None:
    """Raise DcnbError where ``entry``'s options are not the action's or not of its values (or, ``at_start``, its
    places are not the current step's): each candidate would fail on them, and its matching, which is asked first,
    would leave the entry out without a word."""
    from .session import _targets

    try:
        action.check_options(entry.options)
        for target in _targets(action, session._states[-1]) if at_start else ():
            action.count(target, entry.where, entry.options)
    except StepError as e:
        raise DcnbError(f"{what}: {e}") from e


def _leading(candidate: Candidate) -> str:
    """The best candidate so far, as the progress line names it: its number, recipe and time against the baselines."""
    versus = [
        f"{baseline / candidate.dcnb_ms:.2f}x vs {name}"
        for name, baseline in (("torch", candidate.torch_ms), ("torch.compile", candidate.torch_compile_ms))
        if baseline and candidate.dcnb_ms
    ]
    return f"#{candidate.index} {candidate.title}" + (f", {', '.join(versus)}" if versus else "")


def _prefixed(report, prefix: str):
    return lambda message: report(f"{prefix}: {message}")


def _mib(value: int | None) -> str:
    return _num(None if value is None else value / MIB, "{:.2f}")


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else fmt.format(value)
