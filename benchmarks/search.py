"""What Session.search finds and costs: a beam search from the naive step of a model within a budget, then the same
search again in a new session of the same module, which finds what the first built in the build cache. Reports the
candidates tried, the best against the start and against auto_optimize (each as eager's time over dcnb's, from the
candidate's own interleaved timing), and each search's seconds and compiles. A cache of its own (a fresh
``DCNB_CACHE`` under /tmp), so that the first search builds what it tries. One JSON line with ``--json``.

    DCNB_CUDA_BUILD=0 .venv/bin/python benchmarks/search.py --case prenorm_residual --budget 300 --json

``--model NAME`` searches a model of benchmarks/models.py (tests/hf_models.py, at ``--batch``) instead of a zoo case,
gives the search its kept recipe (benchmarks/recipes/NAME.json) to build first and beat, and replays that recipe
beside the search's best; ``--save-recipe`` keeps the best there where it is faster than the kept one (in the
closing interleaved run where there is one), with the command in benchmarks/recipes/README.md. ``search_together``
has the search's own closing run: its best, ``auto_optimize`` and the kept recipe, each over eager's and
torch.compile's time.

    DCNB_CUDA_BUILD=0 .venv/bin/python benchmarks/search.py --model bert_mini_layer --budget 600 --save-recipe --json

``--size full`` searches the model at its full size (tests/hf_models.py's FULL, at its own batch unless
``--batch``), against the same kept recipe; the recipes kept are the test sizes', so ``--save-recipe`` is refused.

    DCNB_CUDA_BUILD=0 .venv/bin/python benchmarks/search.py --model bert_layer --size full --budget 600 --once --json

``--once`` runs the first search only. ``--together SECONDS`` (default 20; 0: none) ends with one interleaved run of
eager, torch.compile, the search's best, the kept recipe and ``auto_optimize`` (replayed from the naive step, its
builds in the cache): the comparison the search's goal is about, from one run rather than runs minutes apart; at
least 8 rounds of it, whatever the seconds.

    DCNB_CUDA_BUILD=0 .venv/bin/python benchmarks/search.py --model gpt2_block --budget 600 --once --json

With ``--workers N`` the candidates compile on a local Dask cluster of N single-threaded workers, with ``--cluster
ADDRESS`` on the cluster whose scheduler is there (``pip install dcnb[cluster]``); every candidate is timed here.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

from common import print_result, time_together


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="mish", help="mish (8x32x64x64), or a case of tests/zoo.py at its bench size")
    parser.add_argument("--model", help="a model of benchmarks/models.py instead of --case")
    parser.add_argument("--batch", type=int, default=None,
                        help="with --model: its inputs repeated this many times (default 4); full size: the batch")
    parser.add_argument("--size", choices=("test", "full"), default="test",
                        help="with --model: its test size (tests/hf_models.py, default) or its full size")
    parser.add_argument("--save-recipe", action="store_true", help="with --model: keep the best if it beats the kept")
    parser.add_argument("--budget", type=float, default=120.0, help="seconds of search")
    parser.add_argument("--objective", default="time")
    parser.add_argument("--beam", type=int, default=3)
    parser.add_argument("--depth", type=int, default=None, help="longest sequence (default: budget)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=0, help="compile on a local Dask cluster of this many workers")
    parser.add_argument("--cluster", default=None, help="compile on the Dask cluster whose scheduler is at this address")
    parser.add_argument("--once", action="store_true", help="one search, not the second that finds its builds cached")
    parser.add_argument("--together", type=float, default=20.0,
                        help="seconds of the closing interleaved run of eager, torch.compile, the best, auto_optimize "
                        "and the kept recipe (0: none)")
    parser.add_argument("--table", action="store_true", help="print each search's table too")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.size == "full" and not args.model:
        parser.error("--size full needs --model")
    if args.size == "full" and args.save_recipe:
        # benchmarks/recipes/ holds the recipes found at the test sizes, which models.py replays at both
        parser.error("--save-recipe keeps test-size recipes: drop it with --size full")
    os.environ["DCNB_CACHE"] = tempfile.mkdtemp(prefix="dcnb-search-")
    os.environ.setdefault("DCNB_CUDA_BUILD", "0")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    import torch

    import dcnb
    from tests.models import Mish
    from tests.zoo import CASES

    def made():
        if args.model:
            from models import _build

            if args.size == "full":
                return _build(args.model, args.batch, "full")
            return _build(args.model, 4 if args.batch is None else args.batch)
        if args.case == "mish":
            torch.manual_seed(0)
            return Mish(), (torch.rand(8, 32, 64, 64),), {}
        return (*CASES[args.case].build(bench=True), {})

    cluster = args.cluster
    if args.workers:
        from dask.distributed import LocalCluster

        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=":0").scheduler_address
    kept = pathlib.Path(__file__).parent / "recipes" / f"{args.model}.json" if args.model else None
    known = [json.loads(kept.read_text())] if kept is not None and kept.exists() else []
    runs = []
    for _ in range(1 if args.once else 2):
        module, inputs, kwargs = made()
        session = dcnb.optimize(module, *inputs, kwargs=kwargs)
        started = time.perf_counter()
        result = session.search(
            args.budget, objective=args.objective, beam=args.beam, depth=args.depth, seed=args.seed, cluster=cluster,
            recipes=known,
        )
        if not runs:
            searched = module, inputs, kwargs
        runs.append((result, time.perf_counter() - started, session))
        if args.table:
            print(result.as_text(), flush=True)
    (first, first_s, session), *again = runs
    second, second_s, _ = again[0] if again else (None, None, None)
    auto = [c for c in first.candidates if [e.name for e in c.recipe] == ["auto_optimize"] and c.ok]

    def speedup(candidate) -> float | None:
        return None if candidate is None or candidate.ratio is None else round(1 / candidate.ratio, 3)

    kept_vs_eager = None
    built = {"search": session.module}  # the search's best, its steps in the session's history
    if known:
        module, inputs, kwargs = searched
        replayed = dcnb.replay(module, *inputs, kwargs=kwargs, recipe=known[0])
        kept_vs_eager = None if replayed.current.speedup() is None else round(replayed.current.speedup(), 3)
        built["kept_recipe"] = replayed.module
    together = time_together(session, *searched, built, args.together) if args.together else {}
    best_vs_eager = None if session.current.speedup() is None else round(session.current.speedup(), 3)
    over = together.get("together_time_over_eager", {})
    if "search" in over:  # the two from one interleaved run, not from runs minutes apart
        best_time, kept_time = over["search"], over.get("kept_recipe")
    else:
        best_time = round(1 / best_vs_eager, 3) if best_vs_eager else None
        kept_time = round(1 / kept_vs_eager, 3) if kept_vs_eager else None
    # the kept recipe found again is not kept again: its two times were one binary's (MobileNetV2's: 0.18x and 0.19x)
    found_again = bool(known) and first.recipe == known[0]
    faster = best_time and (kept_time is None or best_time < kept_time)
    if args.save_recipe and kept is not None and faster and not found_again:
        _keep(kept, first.recipe, " ".join(sys.argv), best_time, kept_time, over.get("auto_optimize"))

    print_result(
        {
            "bench": "search",
            "case": args.model or args.case,
            "size": args.size,
            "shapes": [list(t.shape) for t in made()[1]],
            "budget_s": args.budget,
            "objective": args.objective,
            "beam": args.beam,
            "depth": args.depth,
            "candidates": len(first.candidates) - 1,
            "failed": sum(not c.ok for c in first.candidates),
            "stopped": first.stopped,
            "best": first.best.title,
            "best_vs_eager": speedup(first.best),
            "start_vs_eager": speedup(first.start),
            "auto_optimize_vs_eager": speedup(auto[0] if auto else None),
            "replayed_vs_eager": best_vs_eager,
            "kept_recipe_vs_eager": kept_vs_eager,
            "replayed_vs_torch_compile": None if session.current.speedup("torch_compile") is None
            else round(session.current.speedup("torch_compile"), 3),
            "compiled_on": first.where,
            "first_search_s": round(first.seconds, 1),
            "first_s_per_candidate": round(first.seconds / max(1, len(first.candidates) - 1), 2),
            "first_with_replay_s": round(first_s, 1),
            "first_compiles": first.builds,
            **({
                "second_search_s": round(second.seconds, 1),
                "second_compiles": second.builds,
                "second_best": second.best.title,
            } if second else {}),
            "search_together": _search_together(first, auto[0] if auto else None),
            **together,
            "load": round(os.getloadavg()[0], 2),
        },
        args.json,
    )


def _search_together(result, auto) -> dict:
    """The search's own closing run (what it chose its best by): its best's, ``auto_optimize``'s and the kept
    recipe's times over eager's and torch.compile's, where each was in it."""
    named = {"best": result.best, "auto_optimize": auto}
    if result.known and result.known[0] is not None:
        named["kept_recipe"] = result.candidates[result.known[0]]
    # a candidate that compiled to an earlier one's SDFGs was timed as that one
    named = {name: c if c is None or c.same_as is None else result.candidates[c.same_as] for name, c in named.items()}
    return {
        name: {
            "over_eager": round(c.together, 3),
            "over_torch_compile": None if c.together_compile is None else round(c.together_compile, 3),
        }
        for name, c in named.items()
        if c is not None and c.together is not None
    }


def _keep(
    path: pathlib.Path, recipe: list, command: str, best: float, kept: float | None, auto: float | None
) -> None:
    """The search's best as the model's kept recipe, and how it was found in the recipes' README (``best``,
    ``kept``, ``auto``: the search's best's, the kept recipe's and auto_optimize's time over eager's)."""
    path.write_text(json.dumps(recipe, indent=1) + "\n")
    readme = path.parent / "README.md"
    against = "the first recipe kept for it" if kept is None else f"against the kept recipe's {kept:.2f}x"
    if auto is not None:
        against += f", auto_optimize's {auto:.2f}x"
    line = (
        f"- `{path.name}`: found by `{command}` on {time.strftime('%Y-%m-%d')}: {best:.2f}x eager's time in its "
        f"replay, {against} (load {os.getloadavg()[0]:.1f})\n"
    )
    readme.write_text((readme.read_text() if readme.exists() else "") + line)


if __name__ == "__main__":
    main()
