"""How long a step takes to make on a full-depth network from a Hugging Face config, random weights (``--model``,
MODELS: by default transformers' ResNet with ResNet-18's layout, basic blocks 2-2-2-2, widths 64-512, 11.7 M
parameters, 2x3x64x64), phase by phase as the session reports them through its progress callback (export and import,
autodiff, compile, check, timing): the naive step, then each step named. A cache of its own (a fresh ``DCNB_CACHE``
under /tmp), so that every build is built, and no CUDA build in the background. One JSON line with ``--json``;
``--profile DIR`` keeps a cProfile of each phase (this process only: the compiles run in processes of their own) in
DIR/<step>.<phase>.prof and prints each phase's slowest functions.

    .venv/bin/python benchmarks/transform_time.py --json
    .venv/bin/python benchmarks/transform_time.py --model resnet50 --profile /tmp/prof
    .venv/bin/python benchmarks/transform_time.py --steps auto_optimize --json
    .venv/bin/python benchmarks/transform_time.py --steps auto_optimize fuse_rows map_fusion --each-from-naive --json
    .venv/bin/python benchmarks/transform_time.py --model resnet50 --built-at auto_optimize --json

``--bridge-first`` builds dcnb's PyTorch kernels (``torch_kernels``, once per cache: 10-15 s) before the clock starts,
as a machine that ran dcnb before has them, and says how long that took (``bridge_s``).

``--built-at`` builds a session straight at a recipe instead, as the compiled module does for another batch size or
mode (``Session._built_at``): autodiff, then the steps after it applied again to both sides, one build.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import re
import tempfile
import time
import warnings

from common import print_result


def _resnet(depths: list[int], layer_type: str, widths: list[int]):
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(
        embedding_size=64, hidden_sizes=widths, depths=depths, layer_type=layer_type, num_labels=1000
    )
    return ResNetForImageClassification(config), torch.randn(2, 3, 64, 64)


def _efficientnet_b0():
    import torch
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    config = EfficientNetConfig(
        width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280, image_size=64, dropout_rate=0.0
    )
    return EfficientNetForImageClassification(config), torch.randn(1, 3, 64, 64)


def _convnext_tiny():
    import torch
    from transformers import ConvNextConfig, ConvNextForImageClassification

    config = ConvNextConfig(depths=[3, 3, 9, 3], hidden_sizes=[96, 192, 384, 768], image_size=64)
    return ConvNextForImageClassification(config), torch.randn(1, 3, 64, 64)


def _vit_base():
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return ViTForImageClassification(config), torch.randn(1, 3, 64, 64)


def _bert_base():
    import torch
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertEncoder

    config = BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="eager")
    return BertEncoder(config), torch.randn(1, 32, 768)


#: name -> (what it is, how it is made)
MODELS = {
    "resnet18": ("resnet18 (transformers), 2x3x64x64", lambda: _resnet([2, 2, 2, 2], "basic", [64, 128, 256, 512])),
    "resnet50": (
        "resnet50 (transformers), 2x3x64x64",
        lambda: _resnet([3, 4, 6, 3], "bottleneck", [256, 512, 1024, 2048]),
    ),
    "efficientnet_b0": ("efficientnet-b0 (transformers), 1x3x64x64", _efficientnet_b0),
    "convnext_tiny": ("convnext-tiny (transformers), 1x3x64x64", _convnext_tiny),
    "vit_base": ("vit-base/16 (transformers), 1x3x64x64", _vit_base),
    "bert_base": ("bert-base encoder, 12 layers (transformers), 1x32x768", _bert_base),
}


class _Phases:
    """The progress callback: seconds spent in each phase the session names, in order."""

    def __init__(self, profile: str | None = None):
        #: a cProfile per phase, by phase, where ``profile`` names a folder to keep them in
        self.folder = profile
        self.profiles: dict[str, cProfile.Profile] = {}
        self.step = "naive"
        self.reset()

    def reset(self, step: str = "naive") -> None:
        self.start = self.last = time.perf_counter()
        self.current: str | None = None
        self.seconds: dict[str, float] = {}
        self.step = step

    def __call__(self, message: str) -> None:
        self._close()
        self.current = message
        if self.folder is not None:
            self.profiles.setdefault(f"{self.step}.{_phase(message)}", cProfile.Profile()).enable()

    def _close(self) -> None:
        now = time.perf_counter()
        if self.current is not None:
            self.seconds[self.current] = round(self.seconds.get(self.current, 0.0) + now - self.last, 1)
            if self.folder is not None:
                self.profiles[f"{self.step}.{_phase(self.current)}"].disable()
        self.last = now

    def dump(self, top: int = 12) -> None:
        """Each phase's profile into the folder, and its ``top`` functions by cumulative time, printed."""
        os.makedirs(self.folder, exist_ok=True)
        for name, profile in self.profiles.items():
            path = os.path.join(self.folder, f"{name}.prof")
            profile.dump_stats(path)
            stats = pstats.Stats(path)
            if stats.total_tt < 1.0:
                continue
            print(f"--- {name}: {stats.total_tt:.1f} s profiled, by cumulative time", flush=True)
            stats.sort_stats("cumulative").print_stats(top)

    def total(self) -> float:
        self._close()
        self.current = None
        return round(self.last - self.start, 1)


def _phase(message: str) -> str:
    """A progress message as a file name: its first words (``generating the backward pass by autodiff`` ->
    ``generating_the_backward_pass``)."""
    return re.sub(r"\W+", "_", " ".join(message.split()[:4])).strip("_")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="one JSON line")
    parser.add_argument("--steps", nargs="*", default=[], help="actions to apply after the naive step")
    parser.add_argument("--each-from-naive", action="store_true", help="apply each step to the naive one (undo after)")
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet18", help="the network (default resnet18)")
    parser.add_argument("--profile", metavar="DIR", help="a cProfile of each phase in DIR, its top functions printed")
    parser.add_argument("--built-at", metavar="RECIPE", help="actions, comma-separated: a session built at them")
    parser.add_argument(
        "--bridge-first", action="store_true",
        help="build dcnb's PyTorch kernels (once per cache) before the steps, out of their time, as they are where "
        "dcnb ran before",
    )
    args = parser.parse_args()
    os.environ["DCNB_CACHE"] = tempfile.mkdtemp(prefix="dcnb-transform-time-")
    warnings.simplefilter("ignore")
    import torch

    import dcnb
    from dcnb._src.recipe import Entry

    bridge_s = None
    if args.bridge_first:
        from dcnb._src import torch_kernels

        start = time.perf_counter()
        torch_kernels.bridge()
        bridge_s = round(time.perf_counter() - start, 1)
    torch.manual_seed(0)
    described, make = MODELS[args.model]
    module, x = make()
    phases = _Phases(args.profile)
    if args.built_at:
        recipe = tuple(Entry(name) for name in args.built_at.split(","))
        session = dcnb.Session._built_at(
            module, (x,), {}, recipe, backward=True, training=False, device="cpu", progress=phases
        )
        result = {
            "model": described,
            "load": [round(v, 2) for v in os.getloadavg()],
            "built_at": [e.name for e in session._states[-1].applied],
            "ok": session.current.ok,
            "seconds": phases.total(),
            "phases": phases.seconds,
        }
        print_result(result, args.json)
        return
    # no CUDA build in the background: it would share the cores with the phases measured
    session = dcnb.optimize(module, x, baselines=("torch",), time_budget=0.5, progress=phases, cuda_build=False)
    result = {
        "model": described,
        "load": [round(v, 2) for v in os.getloadavg()],
        **({"bridge_s": bridge_s} if bridge_s is not None else {}),
        "naive_ok": session.current.ok,
        "naive_s": phases.total(),
        "naive_phases": phases.seconds,
    }
    for name in args.steps:
        phases.reset(name)
        step = session.apply(name)
        result |= {f"{name}_ok": step.ok, f"{name}_s": phases.total(), f"{name}_phases": phases.seconds}
        if not step.ok:
            result[f"{name}_error"] = (step.error or "").splitlines()[0][:200]
        elif args.each_from_naive:
            session.undo()
    if args.profile:
        phases.dump()
    print_result(result, args.json)


if __name__ == "__main__":
    main()
