"""What the benchmarks share: a forward+backward call to time, and how a result prints."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the parent of models.py's timed processes imports no torch
    import torch

#: glibc's heap as PyTorch's CPU performance guide has it with jemalloc or TCMalloc: freed memory stays mapped for
#: the next call (never trimmed; blocks up to 32 MiB, its most, from the heap, not mmap). With the default, which
#: memory comes back mapped depends on what ran before: interleaved with dcnb, eager's 12-layer BERT encoder faulted
#: 0-170k pages per call, and dcnb's 0-209k (0.7 s of kernel time), so each side's time moved by 5-15%
STEADY_HEAP = "glibc.malloc.trim_threshold=17179869184:glibc.malloc.mmap_threshold=33554432"


def steady_heap(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a timed process, with STEADY_HEAP unless it sets glibc's tunables itself."""
    return env if "GLIBC_TUNABLES" in env else {**env, "GLIBC_TUNABLES": STEADY_HEAP}


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
