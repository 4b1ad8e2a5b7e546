"""Step: the record of one step of a session (what was applied, whether it held, what it measured)."""

from __future__ import annotations

import dataclasses
from typing import Any

from .timing import Timing
from .verify import Check

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
    compile_seconds: float | None = None
    #: "dcnb", "torch", "torch_compile" -> milliseconds per forward+backward
    timings: dict[str, Timing] = dataclasses.field(default_factory=dict)
    #: "forward"/"backward" -> maps, kernels, tasklets, library_nodes, transients
    counts: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    #: the compiler's output when the generated code did not compile
    log: str | None = None
    #: notes that do not make the step fail (e.g. a baseline that could not run)
    notes: tuple[str, ...] = ()

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
        }

    def as_text(self) -> str:
        """A readable report: outcome, checks, memory, and the timing table (Min/Mean/Median/Stdev/Max in ms)."""
        lines = [f"step {self.index}: {self.title}"]
        if not self.ok:
            lines.append(f"  failed: {self.error}")
            return "\n".join(lines)
        if self.check is not None:
            lines.append(
                f"  allclose: {'yes' if self.check.ok else 'NO'} (max abs error {self.check.max_abs_error:.3g}"
                f" in {self.check.worst or 'nothing'})"
            )
        if self.intermediate_bytes is not None:
            lines.append(f"  intermediate memory: {self.intermediate_bytes / MIB:.2f} MiB")
        if self.compile_seconds is not None:
            lines.append(f"  compile: {self.compile_seconds:.1f} s" + (" (cached)" if self.compile_seconds == 0 else ""))
        if self.timings:
            lines.append("")
            lines.extend("  " + row for row in timing_table(self.timings))
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    @property
    def title(self) -> str:
        text = self.name
        if self.where:
            text += f" (where {', '.join(self.where)})"
        if self.options:
            text += " " + " ".join(f"{k}={v!r}" for k, v in self.options.items())
        return text

    def __str__(self) -> str:
        return self.as_text()

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.as_text())


def timing_table(timings: dict[str, Timing]) -> list[str]:
    header = ["Name", "Min", "Mean", "Median", "Stdev", "Max"]
    rows = [
        [name, f"{t.min:.3f}", f"{t.mean:.3f}", f"{t.median:.3f}", f"{t.stdev:.3f}", f"{t.max:.3f}"]
        for name, t in timings.items()
    ]
    return _table(header, rows)


def history_table(steps: list[Step]) -> list[str]:
    header = ["#", "step", "ok", "max abs err", "interm. MiB", "compile s", "dcnb ms", "torch ms", "compile ms", "vs torch"]
    rows = []
    for s in steps:
        if not s.ok:
            rows.append([str(s.index), s.title, "no", (s.error or "")[:60], "", "", "", "", "", ""])
            continue
        rows.append(
            [
                str(s.index),
                s.title,
                "yes",
                _num(s.max_abs_error, "{:.2e}"),
                _num(None if s.intermediate_bytes is None else s.intermediate_bytes / MIB, "{:.2f}"),
                _num(s.compile_seconds, "{:.1f}"),
                _num(_median(s, "dcnb"), "{:.3f}"),
                _num(_median(s, "torch"), "{:.3f}"),
                _num(_median(s, "torch_compile"), "{:.3f}"),
                _num(s.speedup(), "{:.2f}x"),
            ]
        )
    return _table(header, rows)


def _median(step: Step, name: str) -> float | None:
    t = step.timings.get(name)
    return None if t is None else t.median


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else fmt.format(value)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in rows)]
