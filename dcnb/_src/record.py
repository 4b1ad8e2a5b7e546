"""Step: the record of one step of a session (what was applied, whether it held, what it measured)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .recipe import Entry
from .timing import NOISE_NOTE, Timing
from .verify import Check

if TYPE_CHECKING:
    from .cuda_check import CudaBuild

MIB = 1 << 20
BASELINES = ("torch", "torch_compile")


@dataclasses.dataclass(frozen=True)
class Step:
    """One step: a transformation applied, compiled, checked against PyTorch and timed.

    A step that failed (``ok`` False) says why in ``error`` and changed nothing: the session stayed where it was.
    """

    index: int
    name: str
    options: dict[str, Any]
    where: tuple[str, ...] | None
    ok: bool
    error: str | None = None
    #: places the transformation was applied (0 for the naive step)
    applied: int = 0
    check: Check | None = None
    #: bytes the forward stores for the backward (intermediates; not inputs, parameters or outputs)
    intermediate_bytes: int | None = None
    #: seconds the step waited for its compiles beyond transforming (0.0: every binary came from the cache)
    compile_seconds: float | None = None
    #: "dcnb", "torch", "torch_compile" -> milliseconds per forward+backward
    timings: dict[str, Timing] = dataclasses.field(default_factory=dict)
    #: "forward"/"backward" -> maps, kernels, tasklets, library_nodes, transients
    counts: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    #: the compiler's output when the generated code did not compile
    log: str | None = None
    #: notes that do not make the step fail (e.g. a baseline that could not run)
    notes: tuple[str, ...] = ()
    #: the CUDA build a CPU step also makes in the background (None where there is none); it shows its latest state
    cuda: CudaBuild | None = None

    @property
    def max_abs_error(self) -> float | None:
        return None if self.check is None else self.check.max_abs_error

    def speedup(self, baseline: str = "torch") -> float | None:
        """Median time of ``baseline`` over dcnb's (above 1: dcnb is faster)."""
        if "dcnb" not in self.timings or baseline not in self.timings:
            return None
        return self.timings[baseline].median / self.timings["dcnb"].median

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable summary."""
        return {
            "index": self.index,
            "name": self.name,
            "options": self.options,
            "where": list(self.where) if self.where is not None else None,
            "ok": self.ok,
            "error": self.error,
            "applied": self.applied,
            "max_abs_error": self.max_abs_error,
            "intermediate_bytes": self.intermediate_bytes,
            "compile_seconds": self.compile_seconds,
            "timings": {k: dataclasses.asdict(v) for k, v in self.timings.items()},
            "counts": self.counts,
            "notes": list(self.notes),
            "cuda": None if self.cuda is None else self.cuda.to_dict(),
        }

    def as_text(self) -> str:
        """A readable report: outcome, checks, memory, and the timing table (Min/Mean/Median/Stdev/Max in ms)."""
        lines = [self.headline]
        if not self.ok:
            lines.append(f"  failed: {self.error}")
            return "\n".join(lines)
        lines.extend(f"  {fact}" for fact in self.facts())
        if self.cuda is not None and self.cuda.log:
            lines[-1] += " (its log: Step.cuda.log)"
        if self.timings:
            lines.append("")
            lines.extend("  " + row for row in timing_table(self.timings))
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    @property
    def title(self) -> str:
        """The action, where it was applied and its options, as its recipe entry names them (``Entry.title``)."""
        return Entry(self.name, self.options, self.where).title

    @property
    def headline(self) -> str:
        """``step <index>: <title>``, how every view opens a step."""
        return f"step {self.index}: {self.title}"

    def facts(self) -> list[str]:
        """What a good step measured, a clause each: allclose, intermediate memory, compile time, its CUDA build."""
        found = []
        if self.check is not None:
            found.append(
                f"allclose: {'yes' if self.check.ok else 'NO'} (max abs error {self.check.max_abs_error:.3g}"
                f" in {self.check.worst or 'nothing'})"
            )
        if self.intermediate_bytes is not None:
            found.append(f"intermediate memory: {self.intermediate_bytes / MIB:.2f} MiB")
        if self.compile_seconds is not None:
            found.append(f"compile: {self.compile_seconds:.1f} s" + (" (cached)" if self.compile_seconds == 0 else ""))
        if self.cuda is not None:
            found.append(self.cuda.text)
        return found

    @property
    def summary(self) -> str:
        """The step in one line, as the widget shows it: its headline and outcome, then its ``facts``."""
        if not self.ok:
            return f"{self.headline} failed: {self.error}"
        return " · ".join([self.headline, *self.facts()])

    def __str__(self) -> str:
        return self.as_text()

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.as_text())


#: how much slower than the step it was made from a step may be before its notes say so: beyond the spread of
#: ratios from one interleaved run on these shared machines (benchmarks/NOTES.md)
SLOWER = 1.10


def slower_note(before: Step, after: Step) -> str | None:
    """A note where ``after`` runs slower than ``before``, the step it was made from: by how much and what it
    changed (kernels, library nodes expanded into maps), so that a user sees why before taking it further. Times are
    compared as ratios to eager where both steps timed eager (each in its own run: the machine drifts between
    runs), else as they are."""
    if "dcnb" not in before.timings or "dcnb" not in after.timings:
        return None
    then, now = before.timings["dcnb"].median, after.timings["dcnb"].median
    if "torch" in before.timings and "torch" in after.timings:
        then_ratio, now_ratio = then / before.timings["torch"].median, now / after.timings["torch"].median
        measured = f"{now_ratio:.2f}x eager's time against {then_ratio:.2f}x ({now:.2f} ms against {then:.2f} ms)"
    else:
        then_ratio, now_ratio = then, now
        measured = f"{now:.2f} ms against {then:.2f} ms"
    if now_ratio <= SLOWER * then_ratio:
        return None
    changed = []
    for side in ("forward", "backward"):
        old, new = before.counts.get(side) or {}, after.counts.get(side) or {}
        kinds = [k for k in ("kernels", "library_nodes", "maps") if k in old and k in new and old[k] != new[k]]
        moved = [f"{new[k] - old[k]:+d} {k.replace('_', ' ')}" for k in kinds]
        if moved:
            changed.append(f"{side} {', '.join(moved)}")
    what = f"; it changed {'; '.join(changed)}" if changed else ""
    return (
        f"slower than step {before.index} ({before.title}) it was made from: {measured}{what}. Undo goes back to it; "
        "a profile shows which kernels take the time"
    )


#: how the views name each measured callable
NAMES = {"dcnb": "dcnb", "torch": "torch eager", "torch_compile": "torch.compile"}
#: the history's columns; its medians follow NAMES' order
HISTORY_COLUMNS = (
    "#", "step", "ok", "max abs err", "interm. MiB", "compile s", "dcnb ms", "torch ms", "torch.compile ms", "vs torch"
)
TIMING_COLUMNS = ("", "Min", "Mean", "Median", "Stdev", "Max")


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of a table: its cells as every view shows them."""

    cells: tuple[str, ...]
    #: False for a failed step, whose row ends in its reason
    ok: bool = True
    #: the step the session holds (the views mark it)
    current: bool = False


@dataclasses.dataclass(frozen=True)
class Table:
    """A table as data, so that the text, the static HTML and the widget show the same header and cells.

    A row with fewer cells than there are columns ends in a cell that spans the columns it lacks (a failed step's
    reason, where its numbers would be).
    """

    #: what the table holds ("history", "timing"): the views name their tables by it
    kind: str
    columns: tuple[str, ...]
    rows: tuple[Row, ...]
    caption: str = ""
    #: the columns of text, read left-aligned (numbers read right-aligned)
    left: tuple[int, ...] = ()
    #: whether each row's first cell names the row (a header cell)
    row_headers: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON for the widget's traits and the saved output."""
        return {
            "kind": self.kind,
            "columns": list(self.columns),
            "rows": [{"cells": list(r.cells), "ok": r.ok, "current": r.current} for r in self.rows],
            "caption": self.caption,
            "left": list(self.left),
            "row_headers": self.row_headers,
        }

    def as_text(self) -> list[str]:
        """Lines of a fixed-width table; a spanning cell is one line, cut to the width of the columns it spans."""
        n = len(self.columns)
        widths = [len(c) for c in self.columns]
        for r in self.rows:
            for i, c in enumerate(r.cells if len(r.cells) == n else r.cells[:-1]):
                widths[i] = max(widths[i], len(c))

        def line(cells: tuple[str, ...]) -> str:
            out = [c.ljust(w) if i in self.left else c.rjust(w) for i, (c, w) in enumerate(zip(cells[:-1], widths))]
            last = len(cells) - 1
            span = sum(widths[last:]) + 3 * (n - 1 - last)
            text = " ".join(cells[-1].split())
            if len(text) > span:
                text = text[: span - 1] + "…"
            out.append(text.ljust(span) if last in self.left or last < n - 1 else text.rjust(span))
            return "| " + " | ".join(out) + " |"

        lines = [self.caption] if self.caption else []
        lines += [line(self.columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        return lines + [line(r.cells) for r in self.rows]


def tabulate_history(steps: list[Step], current: int | None = None) -> Table:
    """Every step in a row: outcome, largest error, memory, compile time, median times and the speedup."""
    rows = []
    for s in steps:
        if not s.ok:
            rows.append(Row((str(s.index), s.title, "no", s.error or ""), ok=False, current=s.index == current))
            continue
        # a ratio that the step's notes call noise says so beside it
        noise = " (noise)" if s.speedup() is not None and any(n.startswith(NOISE_NOTE) for n in s.notes) else ""
        cells = (
            str(s.index),
            s.title,
            "yes",
            _num(s.max_abs_error, "{:.2e}"),
            _num(None if s.intermediate_bytes is None else s.intermediate_bytes / MIB, "{:.2f}"),
            _num(s.compile_seconds, "{:.1f}"),
            *(_num(s.timings[n].median if n in s.timings else None, "{:.3f}") for n in NAMES),
            _num(s.speedup(), "{:.2f}x") + noise,
        )
        rows.append(Row(cells, current=s.index == current))
    return Table("history", HISTORY_COLUMNS, tuple(rows), left=(1,))


def tabulate_timings(timings: dict[str, Timing]) -> Table:
    """Min/Mean/Median/Stdev/Max of each measured callable; no rows where nothing was timed."""
    rows = tuple(
        Row((NAMES.get(name, name), *(f"{v:.3f}" for v in (t.min, t.mean, t.median, t.stdev, t.max))))
        for name, t in timings.items()
    )
    return Table("timing", TIMING_COLUMNS, rows, caption="ms per forward+backward", left=(0,), row_headers=True)


def timing_table(timings: dict[str, Timing]) -> list[str]:
    """The timing table as text (Step.as_text)."""
    return tabulate_timings(timings).as_text()


def history_table(steps: list[Step]) -> list[str]:
    """The history as text (Session.as_text)."""
    return tabulate_history(steps).as_text()


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else fmt.format(value)
