"""The ``dcnb`` console command."""

from __future__ import annotations

import argparse
import pathlib
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


def run(args: argparse.Namespace) -> int:
    """Execute a notebook in a fresh kernel; keep the executed notebook and its HTML; print its report cells."""
    from .report import run as run_notebook  # nbclient and nbconvert load only for this command

    if not pathlib.Path(args.notebook).is_file():
        print(f"dcnb run: no notebook at {args.notebook}", file=sys.stderr)
        return 2
    print(f"running {args.notebook} in a fresh kernel" + (f" ({args.scale} scale)" if args.scale else ""), flush=True)
    report = run_notebook(
        args.notebook,
        args.out,
        scale=args.scale,
        timeout=args.timeout,
        echo=lambda text: print(text, end="", flush=True),
        cuda_build=args.cuda_build,
    )
    for text in report.reported:
        print("\n" + text)
    print(f"\nwrote {report.notebook} and {report.html} ({report.seconds:.0f} s)")
    if not report.ok:
        print(f"\n{args.notebook} failed:\n{report.error}\n(the kernel's own messages: {report.kernel_log})", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dcnb", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("demo", help="run the Mish tutorial session and print its steps")
    p.add_argument("--shape", type=_shape, default=(8, 32, 224, 224), help="input shape (default 8x32x224x224)")
    p.add_argument("--time-budget", type=float, default=2.0, help="seconds of timing per step")
    p.set_defaults(run=demo)
    p = commands.add_parser(
        "run", help="execute a notebook headless; write the executed notebook and an HTML report; print its report"
    )
    p.add_argument("notebook", help="the .ipynb to run")
    p.add_argument("--out", default="out", help="folder for the executed notebook and the HTML (default: out)")
    p.add_argument("--scale", choices=("small", "full"), help="problem sizes, for notebooks that read DCNB_NOTEBOOK_SCALE")
    p.add_argument("--timeout", type=float, default=1200, help="seconds any one cell may take (default 1200)")
    p.add_argument(
        "--cuda-build",
        action="store_true",
        help="also build every step for CUDA in the background, as in JupyterLab (default: off; DCNB_CUDA_BUILD=1 too)",
    )
    p.set_defaults(run=run)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
