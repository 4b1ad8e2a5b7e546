"""The errors dcnb raises: each carries one readable sentence naming the cause."""

from __future__ import annotations

from .names import readable_text


class DcnbError(Exception):
    """A problem with the user's module, inputs or step, explained in one sentence."""


class UnsupportedOpError(DcnbError):
    """The module uses an op that cannot be exported to ONNX or has no DaCe implementation."""

    def __init__(self, message: str, *, op: str | None = None, source: str | None = None):
        super().__init__(message)
        self.op = op
        self.source = source


class InputError(DcnbError):
    """The example inputs do not fit the module."""


class CompileError(DcnbError):
    """The generated code did not compile; ``log`` holds the compiler's output."""

    def __init__(self, message: str, *, log: str = ""):
        super().__init__(message)
        self.log = log


class StepError(DcnbError):
    """A transformation cannot be applied here."""


class CacheError(DcnbError):
    """The build cache cannot be written (read-only, full, not a directory); the message names it and says that
    ``DCNB_CACHE`` picks another."""


def check(condition: object, message: str) -> None:
    """Raise StepError(message) unless condition holds."""
    if not condition:
        raise StepError(message)


def first_line(e: BaseException | str) -> str:
    """The first line of an exception's message (or of a text such as a log), else the exception's type name."""
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__ if isinstance(e, BaseException) else ""


def describe(e: BaseException) -> str:
    """An exception raised inside PyTorch or DaCe, in one line: ``TypeError: the first line of its message``, with
    the names DaCe made in it read back."""
    first = readable_text(first_line(e))
    return f"{type(e).__name__}: {first}" if first != type(e).__name__ else first
