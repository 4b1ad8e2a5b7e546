"""Where a model's time goes, kernel by kernel: a dcnb step's compiled module and PyTorch eager, each called
forward+backward under ``torch.profiler``, one JSON line per side. The models and sizes are benchmarks/models.py's.

    python3 benchmarks/kernels.py --device cuda --size full --only bert_layer gpt2_block --recipe auto_optimize
    python3 benchmarks/kernels.py --device cuda --only efficientnet --build    # only make the steps, for the cache

A line has the wall time per call (``wall_ms``: the median of timed rounds without the profiler, a synchronization
after each call), the time the device's kernels (or, on the CPU, PyTorch's operators) took per call
(``busy_ms``), the kernel launches per call and the ``--top`` kernels by their time per call. ``busy_ms`` well
below ``wall_ms`` says the host decides the call's time, not the kernels. ``--build`` makes the steps and stops:
several models' builds can then run side by side and the profiles one at a time on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from typing import Any

from models import _build, _load


def _call(fn, inputs: tuple, kwargs: dict[str, Any]):
    """A forward+backward call of ``fn`` on copies of ``inputs`` that need gradients, every output's gradient ones."""
    import torch

    from dcnb._src import structure

    copies = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    upstream: list = []

    def call() -> None:
        outputs = [o for o in structure.leaves(fn(*copies, **kwargs)) if o.requires_grad]
        if not upstream:
            upstream.extend(torch.ones_like(o) for o in outputs)
        torch.autograd.backward(outputs, upstream)
        for x in copies:
            x.grad = None

    return call


def profile(call, device: str, calls: int, rounds: int, top: int) -> dict[str, Any]:
    """``call``'s median wall time over ``rounds``, then its kernels (operators on the CPU) over ``calls``."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity

    from dcnb._src.timing import synchronizer

    sync = synchronizer(device) or (lambda: None)
    for _ in range(3):
        call()
    sync()
    walls = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        sync()
        walls.append(time.perf_counter() - start)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            call()
        sync()
    on_device = DeviceType.CUDA if device == "cuda" else DeviceType.CPU

    def spent(event) -> float:  # microseconds of the event's own time on its device
        if device == "cuda":
            return getattr(event, "self_device_time_total", 0) or getattr(event, "self_cuda_time_total", 0)
        return event.self_cpu_time_total

    events = [e for e in prof.key_averages() if e.device_type == on_device and spent(e) > 0]
    if device == "cpu":  # the operators at the top of each call, not what they call
        events = [e for e in events if not e.key.startswith(("aten::", "[memory]"))] or events
    events.sort(key=spent, reverse=True)
    return {
        "wall_ms": round(statistics.median(walls) * 1e3, 3),
        "busy_ms": round(sum(map(spent, events)) / calls / 1e3, 3),
        "launches": round(sum(e.count for e in events) / calls, 1),
        "top": [[e.key[:100], round(spent(e) / calls, 1), round(e.count / calls, 2)] for e in events[:top]],
    }


def measure(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows of one model: the step of ``args.recipe`` (the naive one where empty), then eager."""
    import dcnb

    module, inputs, kwargs = _build(name, args.batch, args.size, None)
    device = args.device
    session = dcnb.optimize(
        module, *inputs, kwargs=kwargs, baselines=(), time_budget=0, device=device, training=args.training
    )
    for action in args.recipe:
        step = session.apply(action)
        if not step.ok:
            raise SystemExit(f"{name}: {action} failed: {(step.error or '').splitlines()[0]}")
    if args.build:
        return []
    row = {"model": name, "size": args.size, "device": device, "training": args.training, "load": _load()}
    label = "+".join(args.recipe) or "naive"
    rows = []
    on_device = tuple(x.to(device) for x in inputs)
    keywords = {k: v.to(device) if hasattr(v, "to") else v for k, v in kwargs.items()}
    for side, fn in ((label, session.module), ("eager", module)):
        fn.to(device)
        fn.train(args.training)
        found = profile(_call(fn, on_device, keywords), device, args.calls, args.rounds, args.top)
        rows.append(row | {"side": side} | found)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", required=True, help="models (benchmarks/models.py's names)")
    parser.add_argument("--size", choices=("test", "full"), default="test")
    parser.add_argument("--batch", type=int, help="as benchmarks/models.py's --batch (test size: default 8)")
    parser.add_argument("--recipe", nargs="*", default=["auto_optimize"], help="the actions after the naive step")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--training", action="store_true")
    parser.add_argument("--calls", type=int, default=10, help="calls profiled")
    parser.add_argument("--rounds", type=int, default=30, help="calls timed for the wall time")
    parser.add_argument("--top", type=int, default=12, help="kernels listed")
    parser.add_argument("--build", action="store_true", help="only make the steps")
    args = parser.parse_args()
    if args.size == "test" and args.batch is None:
        args.batch = 8
    warnings.simplefilter("ignore")
    for name in args.only:
        for row in measure(name, args):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
