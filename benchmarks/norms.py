"""Softmax and LayerNorm forward+backward: PyTorch eager, torch.compile, dcnb naive and dcnb's recipe, timed in
one interleaved run (medians, ms). ``--json`` prints one JSON line per operator.

    .venv/bin/python benchmarks/norms.py --json [--op softmax|layernorm|both] [--device cuda]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import dcnb
from dcnb._src import actions, timing
from dcnb._src.cli import _shape

from common import forward_backward, print_result

#: operator -> (module factory for an input shape, default shape: attention scores, transformer activations)
OPS = {
    "softmax": (lambda shape: nn.Softmax(dim=-1), (16, 256, 512)),
    "layernorm": (lambda shape: nn.LayerNorm(shape[-1]), (16, 256, 768)),
}
RECIPE = ("fuse_rows",)


def measure(op: str, shape: tuple[int, ...], budget: float, device: str = "cpu") -> dict:
    make, _ = OPS[op]
    torch.manual_seed(0)
    x = torch.randn(*shape, device=device)
    module = make(shape).to(device)
    naive = dcnb.optimize(module, x, baselines=(), time_budget=0.0, device=device)
    best = dcnb.optimize(module, x, baselines=(), time_budget=0.0, device=device)
    applied = [name for name in RECIPE if device in actions.get(name).devices and best.apply(name).ok]
    upstream = torch.randn(*shape, device=device)
    candidates = {
        "torch_eager": module,
        "torch_compile": torch.compile(module),
        "dcnb_naive": naive.module,
        "dcnb": best.module,
    }
    times = timing.interleaved(
        {name: forward_backward(fn, x, upstream) for name, fn in candidates.items()},
        budget_s=budget,
        warmup=2,
        sync=timing.synchronizer(device),
    )
    result = {"op": op, **{f"{name}_ms": round(t.median, 3) for name, t in times.items()}}
    result |= {
        "dcnb_vs_torch_eager": round(times["dcnb"].median / times["torch_eager"].median, 3),
        "dcnb_vs_torch_compile": round(times["dcnb"].median / times["torch_compile"].median, 3),
        "allclose": all(s.ok and s.check.ok for s in (naive.current, best.current)),
        "recipe": applied,
        "shape": list(shape),
        "runs": times["dcnb"].runs,
        "device": best.device,
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", choices=[*OPS, "both"], default="both")
    parser.add_argument("--shape", type=_shape, default=None, help="input shape (default per operator)")
    parser.add_argument("--budget", type=float, default=15.0, help="seconds for each interleaved timing run")
    parser.add_argument("--json", action="store_true", help="print one JSON line per operator")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    for op in OPS if args.op == "both" else [args.op]:
        result = measure(op, args.shape or OPS[op][1], args.budget, args.device)
        print_result(result, args.json)


if __name__ == "__main__":
    main()
