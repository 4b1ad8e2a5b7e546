"""The Hugging Face models (tests/hf_models.py) through dcnb, forward+backward: the naive step, ``auto_optimize``,
``fuse_rows`` and the best recipe found (benchmarks/recipes/<model>.json, replayable with ``dcnb.replay``), each against PyTorch eager
and torch.compile in the step's own interleaved timing run, and how long each step took to make (export, autodiff,
transformation, compile, check and timing together).

    .venv/bin/python benchmarks/models.py --json                  # one JSON line per model
    .venv/bin/python benchmarks/models.py --markdown              # benchmarks/NOTES.md's models table
    .venv/bin/python benchmarks/models.py --only bert_layer gpt2_block --batch 8
    python3 benchmarks/models.py --json --device cuda --warm 8     # on a GPU (make gpu): builds first, 8 at a time
    .venv/bin/python benchmarks/models.py --size full --list      # the full sizes: ResNet-50 at 8x3x224x224, ...
    DCNB_CUDA_BUILD=0 .venv/bin/python benchmarks/models.py --size full --only resnet --batch 2 --timeout 1200 --json

``--batch K`` repeats every input K times along its batch dimension (the models' configs are tiny; a larger batch
gives 2 cores enough work for the ratios to mean something). Each model runs in a process of its own, so that a
crash in generated code costs one row, not the table. A model's best recipe is the file's steps where that file
exists and every step of it is offered on the device, else the fastest of the naive step and the recipes in SEARCHED
offered there; ``--save-recipes`` writes that one out. ``--warm N`` first makes every model's steps in N processes at
once, untimed, so that the timed run that follows (one model at a time) finds its builds in the cache;
``--build-only`` stops after that.

``--size full`` runs the same architectures at the sizes people train them at (tests/hf_models.py's FULL: ResNet-50,
EfficientNet-B0, MobileNetV2, ConvNeXt-T and ViT-B/16 on 8x3x224x224, a BERT-base layer and a GPT-2 small block on
8x128x768, BERT-base's 12-layer encoder on 8x128 token ids). There ``--batch`` is the batch itself (default: the
entry's 8), ``--layers`` scales a transformer stack's depth down, and every row says what ran (``size``: the
architecture, its depth where scaled down, the input's shape; ``shapes``: every input's). A kept recipe
(benchmarks/recipes/<model>.json, found at the test sizes) is applied in the same session, after the naive step and
the steps of ``--searched``, instead of replayed from scratch (a naive step at full size takes minutes); one that is
one of those steps is not run twice. ``--timeout`` ends a model's process (and its compiles) after that many
seconds; its row keeps the steps that finished and says which did not. Each row has the date and the load average
at its start and end. Timed processes keep glibc's heap mapped between calls (common.STEADY_HEAP), for eager and
dcnb alike. ``--searched`` takes any steps (``channels_last+auto_optimize``: actions joined by ``+``), and
``--together SECONDS`` ends a model's row with every step made, eager and torch.compile in one interleaved run
(``together_time_over_eager``, ``together_time_over_torch_compile``): ratios from one run, where each step's own run
was minutes from the others on a machine whose load moves.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import warnings
from typing import Any

from common import steady_heap, time_together

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
    from dcnb._src.timing import NOISE_NOTE

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
    if any(note.startswith(NOISE_NOTE) for note in step.notes):
        row[f"{prefix}_noise"] = True
    return row


def _load() -> float:
    return round(os.getloadavg()[0], 2)


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


def _shapes(inputs: tuple, kwargs: dict[str, Any]) -> str:
    """Every tensor input's shape: ``8x3x224x224`` or ``8x128, attention_mask 8x128``."""
    import torch

    shown = ["x".join(map(str, x.shape)) for x in inputs if isinstance(x, torch.Tensor)]
    shown += [f"{k} {'x'.join(map(str, v.shape))}" for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    return ", ".join(shown)


def _build(name: str, batch: int | None, size: str = "test", layers: int | None = None) -> tuple:
    import torch
    from tests.hf_models import BY_NAME, FULL_BY_NAME

    known = FULL_BY_NAME if size == "full" else {**BY_NAME, **SIZED}
    if name not in known:
        raise SystemExit(f"no model {name!r} at the {size} size; the models: {', '.join(sorted(known))}")
    if size == "full":
        return FULL_BY_NAME[name].build(batch=batch, layers=layers)
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
    name: str, batch: int | None, budget: float, save: bool, device: str = "cpu", warm: bool = False,
    baselines: tuple[str, ...] = BASELINES, size: str = "test", layers: int | None = None,
    searched: tuple[tuple[str, ...], ...] = SEARCHED, training: bool = False, report=None, together: float = 0.0,
) -> dict[str, Any]:
    """One row: the naive step, auto_optimize from it and the best recipe, each timed against the baselines (none
    where ``warm``: the steps are only made, for the cache). ``size`` "full": tests/hf_models.py's FULL entry at
    ``batch`` (its own where None) and ``layers``. ``report`` is given the row as it is after each step. ``together``
    seconds: every step made is then timed again, with eager and torch.compile, in one interleaved run
    (``time_together``)."""
    import dcnb

    report = report or (lambda row: None)
    module, inputs, kwargs = _build(name, batch, size, layers)
    options = {
        "kwargs": kwargs, "baselines": () if warm else baselines, "time_budget": budget, "device": device,
        "training": training,
    }
    row: dict[str, Any] = {"model": name, "batch": inputs[0].shape[0], "device": device}
    if size == "full":
        from tests.hf_models import FULL_BY_NAME

        row |= {"size": FULL_BY_NAME[name].size(inputs[0].shape[0], layers)}
    row |= {
        "shapes": _shapes(inputs, kwargs), "training": training, "searched": ["+".join(r) for r in searched],
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "load_start": _load(),
    }
    report(row)

    start = time.perf_counter()
    try:
        session = dcnb.optimize(module, *inputs, **options)
    except dcnb.DcnbError as e:
        failed = {"naive_ok": False, "naive_error": str(e).splitlines()[0][:200]}
        return row | failed | {"naive_step_s": round(time.perf_counter() - start, 1), "load_end": _load()}
    naive = session.current
    row |= _step_row("naive", naive, time.perf_counter() - start)
    for baseline in BASELINES:
        if baseline in naive.timings:
            row[f"{baseline}_ms"] = round(naive.timings[baseline].median, 3)
    report(row)

    if not naive.ok:
        return row | {"load_end": _load()}
    made: dict[str, list] = {"naive": []}
    row = _steps(name, row, session, naive, module, inputs, options, size, searched, save, warm, device, report, made)
    if together and not warm:
        built = {}
        for label, recipe in made.items():
            try:
                built[label] = dcnb.replay(
                    module, *inputs, recipe=recipe, **{**options, "baselines": (), "time_budget": 0.0}
                ).module
            except dcnb.DcnbError as e:
                row[f"together_{label}_error"] = str(e).splitlines()[0][:200]
        row |= time_together(session, module, inputs, options["kwargs"], built, together)
    return row | {"load_end": _load()}


def _steps(name, row, session, naive, module, inputs, options, size, searched, save, warm, device, report, made):
    """The steps after the naive one: ``searched``'s, then the kept recipe's (or the fastest tried), into ``row``;
    each step made goes into ``made`` as its recipe, by its label."""
    import dcnb

    tried = [(naive, [], "naive")]
    for recipe in searched:
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
            made[label] = session.recipe
        report(row)

    kept = RECIPES / f"{name}.json"
    recipe = json.loads(kept.read_text()) if kept.exists() else None
    if size == "full" and recipe is not None and _offered(recipe, device):
        row["best_recipe"] = str(kept.relative_to(ROOT))
        same = [label for _, steps, label in tried if steps == recipe]
        if same:  # the kept recipe is a step already made: its figures
            row["best_recipe"] += f" (= {same[0]})"
            for key in ("ok", "step_s", "ms", "vs_torch", "vs_torch_compile", "noise"):
                if f"{same[0]}_{key}" in row:
                    row[f"best_{key}"] = row[f"{same[0]}_{key}"]
            return row
        # applied in this session: the naive step is not made again
        session.reset()
        start = time.perf_counter()
        for entry in recipe:
            step = session.apply(entry["name"], where=entry.get("where"), **entry.get("options", {}))
            if not step.ok:
                break
        if step.ok:
            made["best"] = recipe
        return row | _step_row("best", step, time.perf_counter() - start)
    if recipe is not None and _offered(recipe, device):
        start = time.perf_counter()
        try:
            best = dcnb.replay(module, *inputs, recipe=recipe, **options).current
        except dcnb.DcnbError as e:
            return row | {"best_ok": False, "best_error": str(e).splitlines()[0][:200]}
        row |= {"best_recipe": str(kept.relative_to(ROOT))} | _step_row("best", best, time.perf_counter() - start)
        if best.ok:
            made["best"] = recipe
        return row
    if warm:
        return row
    # no recipe kept (or none offered on the device): the fastest step tried (each against its own run's eager time)
    best, recipe, label = min(tried, key=lambda c: c[0].timings["dcnb"].median / c[0].timings["torch"].median)
    row["best_recipe"] = label
    for key in ("ms", "vs_torch", "vs_torch_compile", "noise"):
        if f"{label}_{key}" in row:
            row[f"best_{key}"] = row[f"{label}_{key}"]
    if save:
        RECIPES.mkdir(exist_ok=True)
        kept.write_text(json.dumps(recipe, indent=1) + "\n")
    return row


def _searched(args: argparse.Namespace) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(recipe.split("+")) for recipe in args.searched)


def _child(args: argparse.Namespace) -> None:
    warnings.simplefilter("ignore")
    row = measure(
        args.child, args.batch, args.budget, args.save_recipes, args.device, bool(args.warm), tuple(args.baselines),
        args.size, args.layers, _searched(args), args.training,
        report=lambda row: print("PARTIAL " + json.dumps(row), flush=True), together=args.together,
    )
    print("MODEL " + json.dumps(row), flush=True)


def _command(name: str, args: argparse.Namespace, warm: bool) -> list[str]:
    command = [sys.executable, __file__, "--child", name, "--device", args.device, "--size", args.size]
    if args.batch is not None:
        command += ["--batch", str(args.batch)]
    if args.layers is not None:
        command += ["--layers", str(args.layers)]
    command += ["--baselines", *args.baselines, "--searched", *args.searched]
    command += ["--budget", "0", "--warm", "1"] if warm else ["--budget", str(args.budget)]
    if args.save_recipes and not warm:
        command.append("--save-recipes")
    if args.training:
        command.append("--training")
    if args.together and not warm:
        command += ["--together", str(args.together)]
    return command


def _row(name: str, done: subprocess.CompletedProcess, timeout: float | None = None) -> dict[str, Any]:
    found = [json.loads(line[6:]) for line in done.stdout.splitlines() if line.startswith("MODEL ")]
    if found:
        return found[0]
    partial = [json.loads(line[8:]) for line in done.stdout.splitlines() if line.startswith("PARTIAL ")]
    row = partial[-1] if partial else {"model": name}
    if done.returncode == "timeout":
        return row | {"unfinished": f"stopped after {timeout:.0f} s", "load_end": _load()}
    last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return row | {"crashed": last[:200]}


def _spawn(command: list[str], timeout: float | None) -> subprocess.CompletedProcess:
    """``command`` run to its end, or until ``timeout`` seconds, when its process group (its compiles too) is
    ended; a stopped run's return code is "timeout"."""
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True,
        env=steady_heap(dict(os.environ)),
    )
    try:
        out, err = child.communicate(timeout=timeout)
        return subprocess.CompletedProcess(command, child.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGTERM)
        try:
            out, err = child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            out, err = child.communicate()
        return subprocess.CompletedProcess(command, "timeout", out, err)


def _run(name: str, args: argparse.Namespace) -> dict[str, Any]:
    return _row(name, _spawn(_command(name, args, warm=False), args.timeout), args.timeout)


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


def _markdown_full(rows: list[dict[str, Any]]) -> str:
    """The full sizes' table: what ran (architecture, depth, shapes, training mode where it was), the ratios of each
    step to eager and torch.compile from its own interleaved run (``(noise)`` where the step's timing says so), each
    step's seconds (what did not finish and why), the load at the start and end of the model's run and its date."""

    def ratios(r: dict[str, Any], prefix: str) -> str:
        if f"{prefix}_vs_torch" not in r:
            if r.get(f"{prefix}_ok") is False:
                return f"failed: {r.get(f'{prefix}_error', '')[:80]}"
            if f"{prefix}_ok" in r:
                return "n/a"
            # a step this run was to make, where the run was stopped or the naive step failed first
            planned = prefix == "best" or prefix in r.get("searched", ("auto_optimize", "fuse_rows"))
            if planned and "unfinished" in r and r.get("naive_ok"):
                return "did not finish"
            return "not run"
        noise = " (noise)" if r.get(f"{prefix}_noise") else ""
        return f"{_ratio(r, f'{prefix}_vs_torch')} / {_ratio(r, f'{prefix}_vs_torch_compile')}{noise}"

    lines = [
        (
            "| model | size | eager ms | torch.compile ms | naive | auto_optimize | fuse_rows | best | best recipe "
            "| step s: naive / auto_optimize / fuse_rows / best | load start, end | date |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        seconds = " / ".join(str(r.get(f"{p}_step_s", "-")) for p in ("naive", "auto_optimize", "fuse_rows", "best"))
        unfinished = r.get("unfinished") or (f"crashed: {r['crashed']}" if "crashed" in r else "")
        lines.append(
            f"| {r['model']} | {r.get('size', r.get('shapes', ''))}{', training' if r.get('training') else ''} "
            f"| {_ms(r.get('torch_ms'))} | {_ms(r.get('torch_compile_ms'))} | {ratios(r, 'naive')} "
            f"| {ratios(r, 'auto_optimize')} | {ratios(r, 'fuse_rows')} | {ratios(r, 'best')} "
            f"| {r.get('best_recipe', '')} | {seconds}{'; ' + unfinished if unfinished else ''} "
            f"| {r.get('load_start', '')}, {r.get('load_end', '')} | {r.get('date', '')} |"
        )
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def listing(size: str = "test") -> list[dict[str, Any]]:
    """The models ``--size`` runs, in order: name, and at full size the architecture, batch, depth and input shape."""
    from tests.hf_models import FULL, MODELS

    if size == "full":
        return [
            {"model": m.name, "size": m.size(), "batch": m.batch, "shape": list(m.shape()), "layers": m.layers}
            for m in FULL
        ]
    return [{"model": m.name} for m in MODELS] + [{"model": name} for name in SIZED]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="one JSON line per model")
    parser.add_argument("--markdown", action="store_true", help="benchmarks/NOTES.md's models table")
    parser.add_argument("--only", nargs="+", help="models to run (names from tests/hf_models.py)")
    parser.add_argument("--size", choices=("test", "full"), default="test", help="the test sizes or the full ones")
    parser.add_argument(
        "--batch", type=int, help="test size: times each input is repeated along its batch dimension (default 4); "
        "full size: the batch (default: the model's, 8)",
    )
    parser.add_argument("--layers", type=int, help="full size: a transformer stack's depth (default: the model's)")
    parser.add_argument("--searched", nargs="*", default=["+".join(r) for r in SEARCHED],
                        help="the steps tried from the naive one, each its actions joined by + (a+b)")
    parser.add_argument("--together", type=float, default=0.0, metavar="SECONDS",
                        help="then every step made, eager and torch.compile in one interleaved run of SECONDS")
    parser.add_argument("--training", action="store_true", help="the steps in training mode (default: eval)")
    parser.add_argument("--timeout", type=float, help="seconds after which a model's run is stopped")
    parser.add_argument("--list", action="store_true", help="list the models of --size, one JSON line each")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds of interleaved timing per step")
    parser.add_argument("--save-recipes", action="store_true", help="keep each model's best step as its recipe file")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--baselines", nargs="+", choices=BASELINES, default=list(BASELINES), help="what dcnb is timed against")
    parser.add_argument("--warm", type=int, default=0, metavar="N", help="first make every step untimed, N at a time")
    parser.add_argument("--build-only", action="store_true", help="with --warm: only make the steps, time nothing")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.size == "test" and args.batch is None:
        args.batch = 4
    if args.layers is not None and args.size != "full":
        parser.error("--layers is for --size full")
    if args.child:
        _child(args)
        return
    if args.list:
        for entry in listing(args.size):
            print(json.dumps(entry))
        return

    names = [entry["model"] for entry in listing(args.size)]
    unknown = set(args.only or ()) - set(names)
    if unknown:
        parser.error(f"no such model at --size {args.size}: {', '.join(sorted(unknown))} (there are {names})")
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
        print(_markdown_full(rows) if args.size == "full" else _markdown(rows))


if __name__ == "__main__":
    main()
