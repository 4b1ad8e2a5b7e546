"""What a call of Session.module at a shape it was not built for costs: the first call (export, import, autodiff,
the build at the session's recipe, the check against PyTorch on that call's inputs) and the later ones, against
PyTorch eager at that shape, interleaved. The zoo's transformer layer built at a batch of 2 after auto_optimize,
called at a batch of 3; a cache of its own (a fresh ``DCNB_CACHE`` under /tmp), so that every build is built. One
JSON line with ``--json``.

    DCNB_CUDA_BUILD=0 .venv/bin/python benchmarks/new_shape.py --json
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

from common import print_result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="transformer", help="a case of tests/zoo.py")
    parser.add_argument("--batch", type=int, default=3, help="the batch size of the calls after the build")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ["DCNB_CACHE"] = tempfile.mkdtemp(prefix="dcnb-new-shape-")
    os.environ.setdefault("DCNB_CUDA_BUILD", "0")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    import torch

    import dcnb
    from dcnb._src.timing import interleaved
    from tests.zoo import CASES

    module, inputs = CASES[args.case].build()
    started = time.perf_counter()
    session = dcnb.optimize(module, *inputs, baselines=(), time_budget=0.0)
    session.apply("auto_optimize")
    built_s = time.perf_counter() - started
    other = [torch.randn(args.batch, *t.shape[1:], dtype=t.dtype) for t in inputs]
    started = time.perf_counter()
    session.module(*other)
    first_s = time.perf_counter() - started

    def call(fn):
        xs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in other]

        def run() -> None:
            out = fn(*xs)
            (out if isinstance(out, torch.Tensor) else out[0]).sum().backward()

        return run

    module.eval()  # the session's mode, which the compiled module keeps
    calls = {"dcnb": call(session.module), "torch": call(module)}
    timings = interleaved(calls, budget_s=10.0, warmup=2, min_runs=args.runs)
    module.zero_grad(set_to_none=True)
    print_result(
        {
            "bench": "new_shape",
            "case": args.case,
            "built_at": [list(t.shape) for t in inputs],
            "called_at": [list(t.shape) for t in other],
            "session_and_auto_optimize_s": round(built_s, 1),
            "first_call_at_new_shape_s": round(first_s, 1),
            "later_call_ms": round(timings["dcnb"].median, 3),
            "eager_ms": round(timings["torch"].median, 3),
            "ratio_to_eager": round(timings["dcnb"].median / timings["torch"].median, 3),
            "load": round(os.getloadavg()[0], 2),
        },
        args.json,
    )


if __name__ == "__main__":
    main()
