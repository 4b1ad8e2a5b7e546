"""What a session is given, checked before anything runs: the module and its example call, the inputs' dtypes, the
device, the time budget. A wrong one raises InputError, saying what was expected."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from . import structure
from .errors import InputError

#: 16-bit floats, which DaCe 2.0.0b1's ONNX importer does not take (BFLOAT16) or computes in no other way
_HALF = (torch.float16, torch.bfloat16)


def call(module: nn.Module, inputs: Sequence[Any], kwargs: Mapping[str, Any]) -> structure.Call:
    """The example call of ``module`` with ``inputs`` and ``kwargs``."""
    if not isinstance(module, nn.Module):
        raise InputError(f"dcnb optimizes torch.nn.Module instances; got {type(module).__name__}")
    found = structure.Call.of(inputs, kwargs)
    if not inputs and not found.keywords:
        raise InputError(f"{type(module).__name__} needs example inputs to build for (their shapes are compiled in)")
    return dataclasses.replace(found, required=structure.left_out(module, found.constants))


def example_inputs(module: nn.Module, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of the example inputs' tensors, where they and the module's parameters and buffers are of a dtype
    dcnb builds."""
    named = [(f"example input {i}", t) for i, t in enumerate(inputs)]
    owned = (("parameter", module.named_parameters()), ("buffer", module.named_buffers()))
    named += [(f"{kind} {name}", t) for kind, items in owned for name, t in items]
    for what, t in named:
        if t.dtype in _HALF:
            raise InputError(
                f"{what} of {type(module).__name__} is {str(t.dtype).removeprefix('torch.')}: dcnb builds float32 "
                "and float64 modules (DaCe's ONNX importer has no 16-bit floats); convert with .float() first"
            )
    # copies: a module that writes into its inputs must not change the user's tensors when dcnb runs it
    return [t.detach().clone() for t in inputs]


def device(name: str) -> str:
    """The device a session runs on: "cpu" or "cuda" ("auto": CUDA where PyTorch sees it)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda"):
        raise InputError(f"device must be 'auto', 'cpu' or 'cuda', not {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("device='cuda' was asked for, but PyTorch sees no CUDA device here")
    return name


def cuda_build(value: Any) -> None:
    if not (value is None or isinstance(value, bool)):
        raise InputError(f"cuda_build must be True or False (None: unless DCNB_CUDA_BUILD=0), not {value!r}")


def time_budget(value: Any) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and 0 <= value < float("inf")):
        raise InputError(f"time_budget must be a number of seconds, 0 or more (0: the fewest runs), not {value!r}")
