"""The ``dcnb`` console command."""

from __future__ import annotations

import argparse
import sys

MISH_RECIPE = ("map_fusion", "tasklet_fusion", "simplify_algebra", "vectorization")


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a shape: {text!r} (write e.g. 8x32x224x224)") from None
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"not a shape: {text!r}")
    return shape


def demo(args: argparse.Namespace) -> int:
    """DaCeML's Mish tutorial as a dcnb session: naive, fusion, tasklet fusion before autodiff, one exp instead of
    three (simplify_algebra), vectorization."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    import dcnb

    class Mish(nn.Module):
        def forward(self, x):
            return x * torch.tanh(F.softplus(x))

    torch.manual_seed(0)
    session = dcnb.optimize(
        Mish(), torch.rand(*args.shape), time_budget=args.time_budget, progress=lambda m: print(f"  .. {m}", flush=True)
    )
    print(session.current.as_text(), end="\n\n", flush=True)
    for name in MISH_RECIPE:
        print(session.apply(name).as_text(), end="\n\n", flush=True)
    print(session.as_text())
    return 0 if all(s.ok for s in session.history) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dcnb", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("demo", help="run the Mish tutorial session and print its steps")
    p.add_argument("--shape", type=_shape, default=(8, 32, 224, 224), help="input shape (default 8x32x224x224)")
    p.add_argument("--time-budget", type=float, default=2.0, help="seconds of timing per step")
    p.set_defaults(run=demo)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
