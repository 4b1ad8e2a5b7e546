"""How long a step takes to make on a ResNet-18-sized network (transformers' ResNet with ResNet-18's layout: basic
blocks 2-2-2-2, widths 64-512, 11.7 M parameters, 2x3x64x64), phase by phase as the session reports them through
its progress callback (export and import, autodiff, compile, check, timing): the naive step, then each step named.
A cache of its own (a fresh ``DCNB_CACHE`` under /tmp), so that every build is built. One JSON line with ``--json``.

    .venv/bin/python benchmarks/transform_time.py --json
    .venv/bin/python benchmarks/transform_time.py --steps auto_optimize --json
    .venv/bin/python benchmarks/transform_time.py --steps auto_optimize fuse_rows map_fusion --each-from-naive --json
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

from common import print_result


def _resnet18():
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    config = ResNetConfig(
        embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic", num_labels=1000
    )
    return ResNetForImageClassification(config), torch.randn(2, 3, 64, 64)


class _Phases:
    """The progress callback: seconds spent in each phase the session names, in order."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.start = self.last = time.perf_counter()
        self.current: str | None = None
        self.seconds: dict[str, float] = {}

    def __call__(self, message: str) -> None:
        self._close()
        self.current = message

    def _close(self) -> None:
        now = time.perf_counter()
        if self.current is not None:
            self.seconds[self.current] = round(self.seconds.get(self.current, 0.0) + now - self.last, 1)
        self.last = now

    def total(self) -> float:
        self._close()
        self.current = None
        return round(self.last - self.start, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="one JSON line")
    parser.add_argument("--steps", nargs="*", default=[], help="actions to apply after the naive step")
    parser.add_argument("--each-from-naive", action="store_true", help="apply each step to the naive one (undo after)")
    args = parser.parse_args()
    os.environ["DCNB_CACHE"] = tempfile.mkdtemp(prefix="dcnb-transform-time-")
    warnings.simplefilter("ignore")
    import dcnb

    module, x = _resnet18()
    phases = _Phases()
    session = dcnb.optimize(module, x, baselines=("torch",), time_budget=0.5, progress=phases)
    result = {
        "model": "resnet18 (transformers), 2x3x64x64",
        "load": [round(v, 2) for v in os.getloadavg()],
        "naive_ok": session.current.ok,
        "naive_s": phases.total(),
        "naive_phases": phases.seconds,
    }
    for name in args.steps:
        phases.reset()
        step = session.apply(name)
        result |= {f"{name}_ok": step.ok, f"{name}_s": phases.total(), f"{name}_phases": phases.seconds}
        if not step.ok:
            result[f"{name}_error"] = (step.error or "").splitlines()[0][:200]
        elif args.each_from_naive:
            session.undo()
    print_result(result, args.json)


if __name__ == "__main__":
    main()
