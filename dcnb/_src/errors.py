"""The errors dcnb raises: each carries one readable sentence naming the cause."""

from __future__ import annotations


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


def check(condition: object, message: str) -> None:
    """Raise StepError(message) unless condition holds."""
    if not condition:
        raise StepError(message)
