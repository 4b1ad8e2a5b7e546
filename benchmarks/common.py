"""What the benchmarks share: a forward+backward call to time, and how a result prints."""

from __future__ import annotations

import json

import torch


def forward_backward(fn, x: torch.Tensor, upstream: torch.Tensor):
    """A call running ``fn`` forward and backward on a copy of ``x`` that needs a gradient."""
    x = x.detach().clone().requires_grad_()

    def call() -> None:
        fn(x).backward(upstream)
        x.grad = None

    return call


def print_result(result: dict, as_json: bool) -> None:
    """One JSON line, or one aligned ``key  value`` line per entry."""
    if as_json:
        print(json.dumps(result), flush=True)
        return
    width = max(map(len, result))
    for key, value in result.items():
        print(f"{key:<{width}}  {value}", flush=True)
