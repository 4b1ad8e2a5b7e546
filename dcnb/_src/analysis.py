"""Analysis: what the views worked out of one good step of a session (its overlays, its code, its profile)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from . import events

T = TypeVar("T")


class Analysis:
    """The named results worked out of one good step (``Session.analysis``), each once: the views fill it
    (views/overlays.py: "overlays", views/sources.py: "sources", views/profile.py: "profile") and read it back.
    It belongs to the session's state of the step, so an undone step's goes with it (a step index is used again
    after an undo; its analysis is not)."""

    def __init__(self, step: int):
        self.step = step
        self._results: dict[str, Any] = {}

    def result(self, name: str, make: Callable[[], T]) -> T:
        """Result ``name``, made by ``make`` where it was not worked out before (emits the event
        "analysis <name>" then, which tests count)."""
        if name not in self._results:
            events.emit(f"analysis {name}")
            self._results[name] = make()
        return self._results[name]

    def known(self, name: str) -> Any | None:
        """Result ``name`` where it was worked out, else None (nothing is worked out here)."""
        return self._results.get(name)

    def store(self, name: str, value: Any) -> None:
        """Keep ``value`` as result ``name``, in place of one worked out before (a step profiled again)."""
        self._results[name] = value

    def take(self, name: str) -> Any | None:
        """Result ``name``, no longer kept (an intermediate that a later result was made from), or None."""
        return self._results.pop(name, None)

    @property
    def names(self) -> tuple[str, ...]:
        """The results worked out so far, in the order they were."""
        return tuple(self._results)

    def __contains__(self, name: str) -> bool:
        return name in self._results

    def __repr__(self) -> str:
        return f"Analysis(step {self.step}: {', '.join(self.names) or 'nothing worked out yet'})"
