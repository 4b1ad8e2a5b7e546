"""Step latency: wall time of Session.apply (transform, autodiff where needed, compile, verify, time) for each step
of the Mish recipe at 8x32x224x224, with a cold build cache, and the phases it spends it in (from the session's
progress messages). ``--json`` prints one JSON line; the target is the median step under 5 s.

    .venv/bin/python benchmarks/latency.py --json [--shape 8x32x224x224]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

from dcnb._src.cli import MISH_RECIPE, _shape

from mish import Mish


class Phases:
    """Seconds per phase, from the time each progress message arrives to the next one."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._phase, self._since = "transform", time.perf_counter()

    def __call__(self, message: str) -> None:
        now = time.perf_counter()
        self.seconds[self._phase] = self.seconds.get(self._phase, 0.0) + now - self._since
        self._phase, self._since = message, now

    def close(self) -> dict[str, float]:
        self("")
        self.seconds.pop("", None)
        return {k: round(v, 2) for k, v in self.seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=_shape, default=(8, 32, 224, 224))
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as cache:
        os.environ["DCNB_CACHE"] = cache  # cold: every step compiles
        import dcnb

        torch.manual_seed(0)
        phases = Phases()
        start = time.perf_counter()
        session = dcnb.optimize(Mish(), torch.rand(*args.shape), progress=phases)
        naive_s = time.perf_counter() - start
        steps = []
        for name in MISH_RECIPE:
            phases.__init__()
            start = time.perf_counter()
            step = session.apply(name)
            steps.append(
                {
                    "step": name,
                    "ok": step.ok,
                    "seconds": round(time.perf_counter() - start, 2),
                    "compile_s": round(step.compile_seconds, 2),
                    "timing_runs": step.timings["dcnb"].runs if step.ok else 0,
                    "phases": phases.close(),
                }
            )
    seconds = [s["seconds"] for s in steps]
    result = {
        "median_step_s": round(statistics.median(seconds), 2),
        "max_step_s": max(seconds),
        "naive_s": round(naive_s, 2),
        "steps": steps,
        "shape": list(args.shape),
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
