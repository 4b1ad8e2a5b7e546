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


def time_together(session, module, inputs, kwargs, built: dict, seconds: float) -> dict:
    """The compiled modules ``built`` (a search's best, the kept recipe's, a model's steps), ``auto_optimize``
    replayed from the naive step of ``module`` (its builds in the cache), eager and torch.compile, in one interleaved
    run of ``seconds`` on ``session``'s example call: each one's median, and the ratios of dcnb's to eager's and to
    torch.compile's (below 1 faster)."""
    import torch

    import dcnb
    from dcnb._src import timing, verify

    modules = {"eager": module, "torch_compile": torch.compile(module), **built}
    failed = {}
    try:
        replayed = dcnb.replay(module, *inputs, kwargs=kwargs, recipe=[{"name": "auto_optimize"}],
                               training=session.training, baselines=(), time_budget=0.0)
        modules["auto_optimize"] = replayed.module
    except dcnb.DcnbError as e:
        failed["auto_optimize"] = str(e).splitlines()[0][:200]
    calls = {name: session._baselines.call(m) for name, m in modules.items()}
    # at least 8 rounds: 3 (20 s of the BERT encoder's 1.5-s calls) ranked the search's best and auto_optimize 17%
    # apart, where 8 and 9 rounds of each put them within 0.3%
    with verify.preserved(module, session.training):
        times = timing.interleaved(calls, budget_s=seconds, warmup=1, min_runs=8)
    eager, compiled = times["eager"].median, times["torch_compile"].median
    dcnbs = [name for name in modules if name not in ("eager", "torch_compile")]
    return {
        "together_ms": {name: round(t.median, 3) for name, t in times.items()},
        "together_time_over_eager": {name: round(times[name].median / eager, 3) for name in dcnbs},
        "together_time_over_torch_compile": {name: round(times[name].median / compiled, 3) for name in dcnbs},
        "together_runs": min(t.runs for t in times.values()),
        "together_noisy": [
            name for name, t in times.items() if t.spread is not None and t.spread > timing.NOISY_SPREAD
        ],
        **({"together_failed": failed} if failed else {}),
    }
