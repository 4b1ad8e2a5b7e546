"""Mish forward+backward: PyTorch eager, F.mish, torch.compile, dcnb naive and dcnb's best recipe, timed in one
interleaved run (medians, ms). ``--json`` prints one JSON line.

The memory-traffic floor: the forward must read x and write y, the backward read x and dy and write dx, so
5 tensors move at least; ``copy`` (y.copy_(x), in the same interleaved run) moves 2 at the machine's copy
bandwidth, so floor_ms = 5/2 * copy_ms.

    .venv/bin/python benchmarks/mish.py --json [--shape 8x32x224x224] [--device cuda --jit]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import dcnb
from dcnb._src import memory, timing
from dcnb._src.cli import MISH_RECIPE, _shape

from common import forward_backward, print_result


#: tensors of x's size that forward+backward read or write at least: x, y (forward); x, dy, dx (backward)
TENSORS_MOVED = 5


class Mish(nn.Module):
    def forward(self, x):
        return x * torch.tanh(F.softplus(x))


class NativeMish(nn.Module):
    def forward(self, x):
        return F.mish(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=_shape, default=(8, 32, 224, 224))
    parser.add_argument("--budget", type=float, default=30.0, help="seconds for the interleaved timing run")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--recipe", default=",".join(MISH_RECIPE), help="dcnb's steps, comma-separated")
    parser.add_argument("--jit", action="store_true", help="also time torch.jit.script (the paper's baseline)")
    parser.add_argument("--ablate", action="store_true", help="also time the recipe without each of its last steps")
    parser.add_argument("--no-pool", action="store_true", help="fresh output buffers every call (no reuse)")
    parser.add_argument("--no-hugepages", action="store_true", help="no huge-page advice for fresh buffers")
    args = parser.parse_args()
    if args.no_pool or args.no_hugepages:
        memory.configure(budget=0 if args.no_pool else memory.limits()[1], huge_pages=not args.no_hugepages)

    steps = [n for n in args.recipe.split(",") if n]
    device = args.device
    torch.manual_seed(0)
    x = torch.rand(*args.shape, device=device)
    naive = dcnb.optimize(Mish(), x, baselines=(), time_budget=0.0, device=device)
    best = dcnb.replay(Mish(), x, recipe=[{"name": n} for n in steps], baselines=(), time_budget=0.0, device=device)
    upstream = torch.randn(*args.shape, device=device)
    target = torch.empty_like(x)
    candidates = {
        "torch_eager": Mish(),
        "torch_native": NativeMish(),
        "torch_compile": torch.compile(Mish()),
        "dcnb_naive": naive.module,
        "dcnb": best.module,
    }
    if args.jit:
        candidates["torch_jit"] = torch.jit.script(Mish())
    if args.ablate:
        for left_out in ("simplify_algebra", "vectorization"):
            recipe = [{"name": n} for n in steps if n != left_out]
            candidates[f"dcnb_without_{left_out}"] = dcnb.replay(
                Mish(), x, recipe=recipe, baselines=(), time_budget=0.0, device=device
            ).module
    calls = {name: forward_backward(fn, x, upstream) for name, fn in candidates.items()}
    calls["copy"] = lambda: target.copy_(x)
    times = timing.interleaved(calls, budget_s=args.budget, warmup=2, sync=timing.synchronizer(device))
    copy_ms = times.pop("copy").median
    floor_ms = TENSORS_MOVED / 2 * copy_ms
    result = {f"{name}_ms": round(t.median, 3) for name, t in times.items()}
    result |= {
        "allclose": all(s.ok and s.check.ok for s in naive.history + best.history),
        "intermediate_bytes_naive": naive.current.intermediate_bytes,
        "intermediate_bytes": best.current.intermediate_bytes,
        "recipe": steps,
        "shape": list(args.shape),
        "runs": times["dcnb"].runs,
        "pool": not args.no_pool,
        "hugepages": not args.no_hugepages,
        "device": best.device,
        "dcnb_vs_torch_eager": round(times["dcnb"].median / times["torch_eager"].median, 3),
        "dcnb_vs_torch_compile": round(times["dcnb"].median / times["torch_compile"].median, 3),
        **({"dcnb_vs_torch_jit": round(times["dcnb"].median / times["torch_jit"].median, 3)} if args.jit else {}),
        "copy_ms": round(copy_ms, 3),
        "copy_gb_per_s": round(2 * x.numel() * x.element_size() / copy_ms / 1e6, 2),
        "floor_ms": round(floor_ms, 3),
        "dcnb_vs_floor": round(times["dcnb"].median / floor_ms, 3),
    }
    print_result(result, args.json)


if __name__ == "__main__":
    main()
