"""Steps are timed alone: work this process runs in the background (a session's CUDA builds, a search's compiles of
the candidates after the one being timed) pauses while any step is timed and goes on afterwards, so that it does not
share the cores with what is measured (under load, eager's own time moved 4.7x)."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Protocol


class Pausable(Protocol):
    def _pause(self) -> None: ...

    def _resume(self) -> None: ...


#: the background work of this process, which ``timing`` pauses
_ALL: weakref.WeakSet[Pausable] = weakref.WeakSet()
#: set while no step is timed: background work starts, or goes on, only then
UNTIMED = threading.Event()
UNTIMED.set()
_LOCK = threading.Lock()
_timed = 0


def register(work: Pausable) -> None:
    """Pause ``work`` (``_pause``) while a step is timed, from now until it is collected; resume it afterwards."""
    with _LOCK:
        _ALL.add(work)
        if _timed:
            work._pause()


@contextlib.contextmanager
def timing() -> Iterator[None]:
    """No background work runs inside (a step being timed, of any session): what runs is stopped with its compilers
    (SIGSTOP) and goes on afterwards; what is queued starts afterwards."""
    global _timed
    with _LOCK:
        _timed += 1
        if _timed == 1:
            UNTIMED.clear()
            for work in list(_ALL):
                work._pause()
    try:
        yield
    finally:
        with _LOCK:
            _timed -= 1
            if _timed == 0:
                for work in list(_ALL):
                    work._resume()
                UNTIMED.set()
