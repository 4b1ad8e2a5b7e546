"""The Hugging Face models (tests/hf_models.py) through dcnb, forward+backward: the naive step, ``auto_optimize``,
``fuse_rows`` and the best recipe found (benchmarks/recipes/<model>.json, replayable with ``dcnb.replay``), each against PyTorch eager
and torch.compile in the step's own interleaved timing run, and how long each step took to make (export, autodiff,
transformation, compile, check and timing together).

    .venv/bin/python benchmarks/models.py --json                  # one JSON line per model
    .venv/bin/python benchmarks/models.py --markdown              # benchmarks/NOTES.md's models table
    .venv/bin/python benchmarks/models.py --only bert_layer gpt2_block --batch 8
    python3 benchmarks/models.py --json --device cuda --warm 8     # on a GPU (make gpu): builds first, 8 at a time

``--batch K`` repeats every input K times along its batch dimension (the models' configs are tiny; a larger batch
gives 2 cores enough work for the ratios to mean something). Each model runs in a process of its own, so that a
crash in generated code costs one row, not the table. A model's best recipe is the file's steps where that file
exists and every step of it is offered on the device, else the fastest of the naive step and the recipes in SEARCHED
offered there; ``--save-recipes`` writes that one out. ``--warm N`` first makes every model's steps in N processes at
once, untimed, so that the timed run that follows (one model at a time) finds its builds in the cache;
``--build-only`` stops after that.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time
import warnings
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECIPES = ROOT / "benchmarks" / "recipes"

BASELINES = ("torch", "torch_compile")
#: the recipes tried from the naive step where no recipe is kept for a model
SEARCHED = (("auto_optimize",), ("fuse_rows",))


def _batched(value: Any, batch: int, rows: int) -> Any:
    """``value`` repeated ``batch`` times along dimension 0 where that is the inputs' batch dimension (``rows``)."""
    import torch

    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == rows:
        return value.repeat(batch, *([1] * (value.dim() - 1)))
    return value


def _step_row(prefix: str, step, seconds: float) -> dict[str, Any]:
    row: dict[str, Any] = {f"{prefix}_ok": step.ok, f"{prefix}_step_s": round(seconds, 1)}
    if not step.ok:
        row[f"{prefix}_error"] = (step.error or "").splitlines()[0][:200]
        return row
    if "dcnb" not in step.timings:  # untimed (--warm)
        return row
    dcnb_ms = step.timings["dcnb"].median
    row[f"{prefix}_ms"] = round(dcnb_ms, 3)
    for baseline in BASELINES:
        if baseline in step.timings:
            row[f"{prefix}_vs_{baseline}"] = round(dcnb_ms / step.timings[baseline].median, 3)
    return row


def bert_mini_layer() -> tuple:
    """transformers' BertLayer at BERT-mini's size (hidden 256, 4 heads, feed-forward 1024) on 8 sequences of 128
    tokens, random weights: the layer issue 14 measured."""
    import torch
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    config = BertConfig(
        hidden_size=256, num_attention_heads=4, intermediate_size=1024, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, attn_implementation="eager",
    )
    return BertLayer(config), (torch.randn(8, 128, 256),), {}


#: models at sizes of their own (the batch is not scaled)
SIZED = {"bert_mini_layer": bert_mini_layer}


def _build(name: str, batch: int) -> tuple:
    import torch
    from tests.hf_models import BY_NAME

    if name in SIZED:
        torch.manual_seed(0)
        return SIZED[name]()
    module, inputs, kwargs = BY_NAME[name].build()
    rows = inputs[0].shape[0]
    inputs = tuple(_batched(x, batch, rows) for x in inputs)
    kwargs = {k: _batched(v, batch, rows) for k, v in kwargs.items()}
    return module, inputs, kwargs


def _offered(recipe: list[dict[str, Any]], device: str) -> bool:
    from dcnb._src import actions

    return all(device in actions.get(step["name"]).devices for step in recipe)


def measure(
    name: str, batch: int, budget: float, save: bool, device: str = "cpu", warm: bool = False,
    baselines: tuple[str, ...] = BASELINES,
) -> dict[str, Any]:
    """One row: the naive step, auto_optimize from it and the best recipe, each timed against the baselines (none
    where ``warm``: the steps are only made, for the cache)."""
    import dcnb

    module, inputs, kwargs = _build(name, batch)
    options = {"kwargs": kwargs, "baselines": () if warm else baselines, "time_budget": budget, "device": device}
    row: dict[str, Any] = {"model": name, "batch": inputs[0].shape[0], "device": device}

    start = time.perf_counter()
    try:
        session = dcnb.optimize(module, *inputs, **options)
    except dcnb.DcnbError as e:
        return row | {"naive_ok": False, "naive_error": str(e).splitlines()[0][:200]}
    naive = session.current
    row |= _step_row("naive", naive, time.perf_counter() - start)
    for baseline in BASELINES:
        if baseline in naive.timings:
            row[f"{baseline}_ms"] = round(naive.timings[baseline].median, 3)

    if not naive.ok:
        return row
    tried = [(naive, [], "naive")]
    for recipe in SEARCHED:
        if not _offered([{"name": n} for n in recipe], device):
            continue
        session.reset()
        start = time.perf_counter()
        for action in recipe:
            step = session.apply(action)
            if not step.ok:
                break
        label = "+".join(recipe)
        row |= _step_row(label, step, time.perf_counter() - start)
        if step.ok:
            tried.append((step, session.recipe, label))

    kept = RECIPES / f"{name}.json"
    recipe = json.loads(kept.read_text()) if kept.exists() else None
    if recipe is not None and _offered(recipe, device):
        start = time.perf_counter()
        try:
            best = dcnb.replay(module, *inputs, recipe=recipe, **options).current
        except dcnb.DcnbError as e:
            return row | {"best_ok": False, "best_error": str(e).splitlines()[0][:200]}
        row |= {"best_recipe": str(kept.relative_to(ROOT))} | _step_row("best", best, time.perf_counter() - start)
        return row
    if warm:
        return row
    # no recipe kept (or none offered on the device): the fastest step tried (each against its own run's eager time)
    best, recipe, label = min(tried, key=lambda c: c[0].timings["dcnb"].median / c[0].timings["torch"].median)
    row["best_recipe"] = label
    for key in ("ms", "vs_torch", "vs_torch_compile"):
        if f"{label}_{key}" in row:
            row[f"best_{key}"] = row[f"{label}_{key}"]
    if save:
        RECIPES.mkdir(exist_ok=True)
        kept.write_text(json.dumps(recipe, indent=1) + "\n")
    return row


def _child(args: argparse.Namespace) -> None:
    warnings.simplefilter("ignore")
    row = measure(
        args.child, args.batch, args.budget, args.save_recipes, args.device, bool(args.warm), tuple(args.baselines)
    )
    print("MODEL " + json.dumps(row), flush=True)


def _command(name: str, args: argparse.Namespace, warm: bool) -> list[str]:
    command = [sys.executable, __file__, "--child", name, "--batch", str(args.batch), "--device", args.device]
    command += ["--baselines", *args.baselines]
    command += ["--budget", "0", "--warm", "1"] if warm else ["--budget", str(args.budget)]
    if args.save_recipes and not warm:
        command.append("--save-recipes")
    return command


def _row(name: str, done: subprocess.CompletedProcess) -> dict[str, Any]:
    found = [json.loads(line[6:]) for line in done.stdout.splitlines() if line.startswith("MODEL ")]
    if found:
        return found[0]
    last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return {"model": name, "crashed": last[:200]}


def _run(name: str, args: argparse.Namespace) -> dict[str, Any]:
    return _row(name, subprocess.run(_command(name, args, warm=False), capture_output=True, text=True, cwd=ROOT))


def _warm(names: list[str], args: argparse.Namespace) -> None:
    """Every model's steps made, ``args.warm`` processes at a time, untimed: the builds land in the cache."""
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str) -> None:
        start = time.perf_counter()
        done = subprocess.run(_command(name, args, warm=True), capture_output=True, text=True, cwd=ROOT)
        row = _row(name, done)
        print(f"warmed {name} in {time.perf_counter() - start:.0f} s: {json.dumps(row)}", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(args.warm) as pool:
        list(pool.map(one, names))


def _ratio(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    return "n/a" if value is None else f"{value:.2f}"


def _markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | batch | eager ms | naive / eager | auto_optimize / eager | fuse_rows / eager | best | best / eager "
        "| best / torch.compile | naive step s | auto_optimize step s | fuse_rows step s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "crashed" in r or not r.get("naive_ok"):
            reason = r.get("crashed") or r.get("naive_error")
            lines.append(f"| {r['model']} | {r.get('batch', '')} | failed: {reason} | | | | | | | | | |")
            continue
        lines.append(
            f"| {r['model']} | {r['batch']} | {r.get('torch_ms', 'n/a')} | {_ratio(r, 'naive_vs_torch')} "
            f"| {_ratio(r, 'auto_optimize_vs_torch')} | {_ratio(r, 'fuse_rows_vs_torch')} | {r.get('best_recipe', '')} "
            f"| {_ratio(r, 'best_vs_torch')} | {_ratio(r, 'best_vs_torch_compile')} | {r['naive_step_s']} "
            f"| {r.get('auto_optimize_step_s', 'n/a')} | {r.get('fuse_rows_step_s', 'n/a')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="one JSON line per model")
    parser.add_argument("--markdown", action="store_true", help="benchmarks/NOTES.md's models table")
    parser.add_argument("--only", nargs="+", help="models to run (names from tests/hf_models.py)")
    parser.add_argument("--batch", type=int, default=4, help="times each input is repeated along its batch dimension")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds of interleaved timing per step")
    parser.add_argument("--save-recipes", action="store_true", help="keep each model's best step as its recipe file")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--baselines", nargs="+", choices=BASELINES, default=list(BASELINES), help="what dcnb is timed against")
    parser.add_argument("--warm", type=int, default=0, metavar="N", help="first make every step untimed, N at a time")
    parser.add_argument("--build-only", action="store_true", help="with --warm: only make the steps, time nothing")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return

    from tests.hf_models import MODELS

    names = [m.name for m in MODELS] + list(SIZED)
    unknown = set(args.only or ()) - set(names)
    if unknown:
        parser.error(f"no such model: {', '.join(sorted(unknown))} (tests/hf_models.py and SIZED have {names})")
    names = [name for name in names if not args.only or name in args.only]
    if args.warm:
        _warm(names, args)
        if args.build_only:
            return
    rows = []
    for name in names:
        row = _run(name, args)
        rows.append(row)
        print(json.dumps(row) if args.json else f"{name}: {json.dumps(row)}", file=sys.stdout if args.json else sys.stderr, flush=True)
    if args.markdown or not args.json:
        print(_markdown(rows))


if __name__ == "__main__":
    main()
