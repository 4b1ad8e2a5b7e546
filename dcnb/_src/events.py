"""Named events that tests can count (``emit`` does nothing unless someone listens)."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

_listeners: list[collections.Counter] = []


def emit(name: str) -> None:
    for counter in _listeners:
        counter[name] += 1


@contextlib.contextmanager
def count() -> Iterator[collections.Counter]:
    """Count the events emitted inside the block: ``with count() as c: ...; c["build"]``."""
    counter: collections.Counter = collections.Counter()
    _listeners.append(counter)
    try:
        yield counter
    finally:
        _listeners.remove(counter)
