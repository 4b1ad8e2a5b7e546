"""A pass against the same code without it: a full-size model's steps made twice in one process, once with every
pass of dcnb's phases (dcnb/_src/passes) and once without the ones named, then both, eager and torch.compile timed
forward+backward in one interleaved run: one JSON line with each one's median, the ratios, and each build's
intermediate memory (what the forward stores for the backward).

    DCNB_CUDA_BUILD=0 .venv/bin/python benchmarks/passes.py --without activations_into_norms --only mobilenet_v2 \
        --training --steps channels_last+auto_optimize --seconds 60 --json

The process keeps glibc's heap mapped between calls (common.STEADY_HEAP), as models.py's timed processes do. A
pass that changes nothing in a model's SDFGs leaves both builds the same binaries (the build cache's key is taken
after the build's passes): their ratio is then the run's noise.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
from collections.abc import Iterator

from common import print_result, steady_heap


@contextlib.contextmanager
def without(names: set[str]) -> Iterator[None]:
    """dcnb's phases without the passes ``names`` while the block runs."""
    from dcnb._src import passes

    phases = {
        name: value for name, value in vars(passes).items()
        if isinstance(value, tuple) and value and all(isinstance(p, passes.Pass) for p in value)
    }
    known = {p.name for phase in phases.values() for p in phase}
    if names - known:
        raise SystemExit(f"no pass named {', '.join(sorted(names - known))}; the passes: {', '.join(sorted(known))}")
    builds = {device: next(n for n, v in phases.items() if v is phase) for device, phase in passes.BUILD.items()}
    try:
        for name, phase in phases.items():
            setattr(passes, name, tuple(p for p in phase if p.name not in names))
        passes.BUILD.update({device: getattr(passes, name) for device, name in builds.items()})
        yield
    finally:
        for name, phase in phases.items():
            setattr(passes, name, phase)
        passes.BUILD.update({device: phases[name] for device, name in builds.items()})


def measure(args: argparse.Namespace) -> dict:
    import torch

    import dcnb
    from dcnb._src import timing, verify
    from tests.hf_models import FULL_BY_NAME

    model = FULL_BY_NAME[args.only]
    module, inputs, kwargs = model.build(batch=args.batch)
    module.train(args.training)
    steps = [s for s in args.steps.split("+") if s]
    row = {"model": args.only, "architecture": model.architecture, "training": args.training, "steps": steps,
           "without": sorted(args.without), "date": datetime.datetime.now().isoformat(timespec="minutes"),
           "load_start": round(os.getloadavg()[0], 2)}
    sessions = {}
    for variant, removed in (("with", set()), ("without", set(args.without))):
        with without(removed):
            session = dcnb.optimize(module, *inputs, kwargs=kwargs, training=args.training, cuda_build=False,
                                    baselines=(), time_budget=0.0)
            for step in steps:
                made = session.apply(step)
                if not made.ok:
                    raise SystemExit(f"{variant}: {step} failed: {made.error}")
        sessions[variant] = session
        row[f"intermediate_mib_{variant}"] = round(session.current.intermediate_bytes / 2**20, 1)
    modules = {"eager": module, "torch_compile": torch.compile(module), **{k: s.module for k, s in sessions.items()}}
    calls = {name: sessions["with"]._baselines.call(m) for name, m in modules.items()}
    with verify.preserved(module, args.training):
        times = timing.interleaved(calls, budget_s=args.seconds, warmup=1, min_runs=8)
    medians = {name: t.median for name, t in times.items()}
    row["ms"] = {name: round(ms, 3) for name, ms in medians.items()}
    row["with_over_without"] = round(medians["with"] / medians["without"], 3)
    for variant in ("with", "without"):
        row[f"{variant}_over_eager"] = round(medians[variant] / medians["eager"], 3)
        row[f"{variant}_over_torch_compile"] = round(medians[variant] / medians["torch_compile"], 3)
    row["runs"] = min(t.runs for t in times.values())
    row["load_end"] = round(os.getloadavg()[0], 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--without", nargs="+", required=True, help="the passes left out (their function's names)")
    parser.add_argument("--only", required=True, help="a model of tests/hf_models.py's full sizes")
    parser.add_argument("--batch", type=int, default=None, help="the batch (default: the model's)")
    parser.add_argument("--training", action="store_true", help="in training mode (default: eval)")
    parser.add_argument("--steps", default="", help="the actions after the naive step, joined by +")
    parser.add_argument("--seconds", type=float, default=60.0, help="the interleaved run's budget")
    parser.add_argument("--json", action="store_true", help="one JSON line")
    args = parser.parse_args()
    args.without = set(args.without)
    if "GLIBC_TUNABLES" not in os.environ:
        os.execve(sys.executable, [sys.executable, *sys.argv], steady_heap(dict(os.environ)))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    print_result(measure(args), args.json)


if __name__ == "__main__":
    main()
