"""Per-call overhead: Session.module against PyTorch eager on a tiny Mish input, where the work is negligible and
the call path is what is timed. One interleaved run (medians, microseconds); ``--json`` prints one JSON line.

    .venv/bin/python benchmarks/overhead.py --json [--shape 4x16]
"""

from __future__ import annotations

import argparse

import torch

import dcnb
from dcnb._src import timing
from dcnb._src.cli import MISH_RECIPE, _shape

from common import print_result
from mish import Mish


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=_shape, default=(4, 16))
    parser.add_argument("--budget", type=float, default=10.0, help="seconds for the interleaved timing run")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.rand(*args.shape)
    session = dcnb.replay(Mish(), x, recipe=[{"name": n} for n in MISH_RECIPE], baselines=(), time_budget=0.0)
    modules = {"dcnb": session.module, "torch_eager": Mish()}
    leaf = x.clone().requires_grad_()
    upstream = torch.ones_like(x)

    def inference(module):
        def call() -> None:
            with torch.no_grad():
                module(x)

        return call

    def training(module):
        def call() -> None:
            module(leaf).backward(upstream)
            leaf.grad = None

        return call

    calls = {f"{name}_forward": inference(m) for name, m in modules.items()}
    calls |= {f"{name}_forward_backward": training(m) for name, m in modules.items()}
    times = timing.interleaved(calls, budget_s=args.budget, warmup=50, min_runs=200, max_runs=20000)
    result = {f"{name}_us": round(t.median * 1e3, 2) for name, t in times.items()}
    result |= {
        "forward_vs_torch_eager": round(times["dcnb_forward"].median / times["torch_eager_forward"].median, 3),
        "forward_backward_vs_torch_eager": round(
            times["dcnb_forward_backward"].median / times["torch_eager_forward_backward"].median, 3
        ),
        "recipe": list(MISH_RECIPE),
        "shape": list(args.shape),
        "runs": times["dcnb_forward"].runs,
    }
    print_result(result, args.json)


if __name__ == "__main__":
    main()
