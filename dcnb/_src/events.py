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
    finally:  # by identity: an equal counter of a block around this one listens on
        _listeners[:] = [c for c in _listeners if c is not counter]
