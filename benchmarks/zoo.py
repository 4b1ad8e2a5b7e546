"""The model zoo (tests/zoo.py) through dcnb: does each entry build and match PyTorch, forward and backward, and how
fast is it after ``auto_optimize`` against PyTorch eager (median forward+backward time, dcnb / torch, measured in
one interleaved run per entry, at the entry's benchmark shapes).

    .venv/bin/python benchmarks/zoo.py --markdown     # docs/coverage.md's zoo table
    .venv/bin/python benchmarks/zoo.py --json         # one JSON line per entry
    .venv/bin/python benchmarks/zoo.py --sweep        # every action on every entry (at test shapes): pass counts
    .venv/bin/python benchmarks/zoo.py --only mlp convnet

Each entry runs in a process of its own, so that a crash in generated code costs one row, not the table.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]

ACTIONS = [
    "expand", "map_fusion", "subgraph_fusion", "tasklet_fusion", "vectorization", "simplify_algebra", "fuse_rows",
    "auto_optimize",
]
#: what an action says when it matches nothing
NOTHING_TO_DO = ("matches nothing", "finds no group of maps it can fuse")


def _error(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def measure(name: str, training: bool, budget: float) -> dict:
    """One table row: forward-only and forward+backward builds, then auto_optimize, timed against PyTorch."""
    import dcnb
    from tests.zoo import CASES

    module, inputs = CASES[name].build(bench=True)
    row: dict = {"model": name, "mode": "train" if training else "eval"}
    sessions = {}
    for part, backward in (("forward", False), ("backward", True)):
        try:
            sessions[part] = dcnb.optimize(
                module, *inputs, backward=backward, training=training, baselines=("torch",), time_budget=budget
            )
            row[f"{part}_ok"] = True
        except dcnb.DcnbError as e:
            row[f"{part}_ok"], row[f"{part}_error"] = False, _error(e)
    if not sessions:
        return row
    row["timed"] = "forward+backward" if "backward" in sessions else "forward"
    session = sessions.get("backward") or sessions["forward"]
    step = session.apply("auto_optimize")
    row["auto_optimize_ok"] = step.ok
    if not step.ok:
        row["auto_optimize_error"] = step.error
        step = session.current  # the naive build, timed the same way
    row["dcnb_ms"] = round(step.timings["dcnb"].median, 4)
    row["torch_ms"] = round(step.timings["torch"].median, 4)
    row["dcnb_vs_torch_eager"] = round(step.timings["dcnb"].median / step.timings["torch"].median, 3)
    return row


def sweep(name: str, training: bool) -> list[dict]:
    """Every action, each from the naive build, on the entry at its test shapes."""
    import dcnb
    from tests.zoo import CASES

    module, inputs = CASES[name].build()
    base = {"model": name, "mode": "train" if training else "eval"}
    try:
        session = dcnb.optimize(module, *inputs, training=training, baselines=(), time_budget=0.01)
    except dcnb.DcnbError as e:
        return [base | {"action": "naive", "ok": False, "error": _error(e)}]
    rows = [base | {"action": "naive", "ok": True}]
    for action in ACTIONS:
        step = session.apply(action, **({"vector_len": 4} if action == "vectorization" else {}))
        rows.append(base | {"action": action, "ok": step.ok, "applied": step.applied, "error": step.error})
        if step.ok:
            session.undo()
    return rows


def _child(args: argparse.Namespace) -> None:
    warnings.simplefilter("ignore")
    name, mode = args.child.split(":")
    training = mode == "train"
    result = sweep(name, training) if args.sweep else [measure(name, training, args.budget)]
    for row in result:
        print("ZOO " + json.dumps(row), flush=True)


def _run_entry(name: str, training: bool, args: argparse.Namespace) -> list[dict]:
    command = [sys.executable, __file__, "--child", f"{name}:{'train' if training else 'eval'}", "--budget", str(args.budget)]
    if args.sweep:
        command.append("--sweep")
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    rows = [json.loads(line[4:]) for line in done.stdout.splitlines() if line.startswith("ZOO ")]
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        rows.append({"model": name, "mode": "train" if training else "eval", "crashed": last})
    return rows


def _outcome(row: dict) -> str:
    if "crashed" in row:
        return "**crash**"
    if row["ok"]:
        return "ok"
    return "n/a" if any(reason in (row.get("error") or "") for reason in NOTHING_TO_DO) else "**FAIL**"


def _summary(rows: list[dict]) -> str:
    if "action" not in rows[0]:
        return json.dumps(rows[0])
    return ", ".join(f"{r.get('action', 'process')} {_outcome(r)}" for r in rows) + "".join(
        f"\n    {r['action']}: {r['error']}" for r in rows if "action" in r and _outcome(r) == "**FAIL**"
    )


def _markdown(rows: list[dict]) -> str:
    def yes(value) -> str:
        return "yes" if value else "**no**"

    lines = [
        "| model | mode | forward ok | backward ok | dcnb / torch eager after `auto_optimize` |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "crashed" in r:
            lines.append(f"| {r['model']} | {r['mode']} | crashed: {r['crashed']} | | |")
            continue
        ratio = f"{r['dcnb_vs_torch_eager']:.2f}" if "dcnb_vs_torch_eager" in r else "n/a"
        if r.get("timed") == "forward":
            ratio += " (forward only)"
        if "auto_optimize_error" in r:
            ratio += " (naive: auto_optimize failed)"
        lines.append(f"| {r['model']} | {r['mode']} | {yes(r.get('forward_ok'))} | {yes(r.get('backward_ok'))} | {ratio} |")
    return "\n".join(lines)


def _sweep_table(rows: list[dict]) -> str:
    lines = ["| model | mode | naive | " + " | ".join(ACTIONS) + " |", "|---|---|---" + "|---" * len(ACTIONS) + "|"]
    entries: dict[tuple[str, str], dict[str, str]] = {}
    for r in rows:
        cells = entries.setdefault((r["model"], r["mode"]), {})
        if "action" in r:
            cells[r["action"]] = _outcome(r)
    for (model, mode), cells in entries.items():
        lines.append(
            f"| {model} | {mode} | {cells.get('naive', '**crash**')} | "
            + " | ".join(cells.get(a, "**crash**") for a in ACTIONS)
            + " |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", action="store_true", help="print docs/coverage.md's zoo table")
    parser.add_argument("--json", action="store_true", help="print one JSON line per entry")
    parser.add_argument("--sweep", action="store_true", help="apply every action to every entry")
    parser.add_argument("--only", nargs="+", help="entries to run (names from tests/zoo.py)")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds of interleaved timing per entry")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return

    from tests.zoo import ZOO

    rows = []
    for case in ZOO:
        if args.only and case.name not in args.only:
            continue
        for training in case.modes:
            entry_rows = _run_entry(case.name, training, args)
            rows.extend(entry_rows)
            if args.json:
                for row in entry_rows:
                    print(json.dumps(row), flush=True)
            else:  # progress, while the table waits for every entry
                print(f"{case.name} ({'train' if training else 'eval'}): {_summary(entry_rows)}", file=sys.stderr, flush=True)
    if args.markdown or not args.json:
        print(_sweep_table(rows) if args.sweep else _markdown(rows))


if __name__ == "__main__":
    main()
