"""How the session widget copes with transformer SDFGs: the size of their pictures and how long the view's
layout takes on them (the view's own code, under node; median of 5 after a warm-up), with map scopes collapsed
(the default above 300 nodes) and expanded. ``--json`` prints one line.

    .venv/bin/python benchmarks/view.py --json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time
import warnings

import torch
from torch import nn

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dcnb._src import graph, passes, program  # noqa: E402
from dcnb._src.frontend import import_module  # noqa: E402

LAYOUT = """
const { layoutGraph, scopeIds, countNodes } = require(process.argv[1] + '/labextension/lib-test/layout.js');
const pictures = JSON.parse(require('fs').readFileSync(process.argv[2], 'utf8'));
const result = {};
for (const [name, g] of Object.entries(pictures)) {
  const runs = (collapsed) => {
    layoutGraph(g, collapsed);  // warm-up
    const times = [];
    for (let i = 0; i < 5; i++) {
      const t = process.hrtime.bigint();
      layoutGraph(g, collapsed);
      times.push(Number(process.hrtime.bigint() - t) / 1e6);
    }
    times.sort((a, b) => a - b);
    return times[2];
  };
  result[name] = { nodes: countNodes(g), collapsed_ms: runs(new Set(scopeIds(g))), expanded_ms: runs(new Set()) };
}
console.log(JSON.stringify(result));
"""


class EncoderLayer(nn.Module):
    """A BERT-style encoder layer written out (PyTorch's own takes a fused path that does not export)."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, 4 * d_model)
        self.ff2 = nn.Linear(4 * d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (f(x).reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for f in (self.q, self.k, self.v))
        attention = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        mixed = (attention @ v).transpose(1, 2).reshape(b, s, d)
        x = self.norm1(x + self.out(mixed))
        return self.norm2(x + self.ff2(torch.nn.functional.gelu(self.ff1(x))))


def pictures(d_model: int, heads: int, seq: int, batch: int) -> dict:
    """The SDFGs of one encoder layer and of a stack of six (a small transformer: thousands of nodes)."""
    x = torch.rand(batch, seq, d_model)
    result = {}
    for layers in (1, 6):
        model = nn.Sequential(*(EncoderLayer(d_model, heads) for _ in range(layers))).eval()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            imported = import_module(model, (x,), training=False)
            passes.run(passes.ON_IMPORT, imported.sdfg)
            prog = program.differentiate(imported.sdfg, imported, imported.inputs + list(imported.param_paths))
        result[f"layers{layers}_forward"] = graph.describe(prog.forward)
        result[f"layers{layers}_backward"] = graph.describe(prog.backward)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    start = time.perf_counter()
    data = pictures(d_model=64, heads=4, seq=16, batch=2)
    describe_s = time.perf_counter() - start
    subprocess.run(["npx", "--no-install", "tsc", "-p", "labextension/tsconfig.test.json"], cwd=ROOT, check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(data, f)
        f.flush()
        size = pathlib.Path(f.name).stat().st_size
        out = subprocess.run(["node", "-e", LAYOUT, str(ROOT), f.name], capture_output=True, text=True, check=True)
    result = {"model": "BERT-style encoder layers (d=64, 4 heads, ff=256), 2x16x64", "json_bytes": size,
              "import_and_autodiff_s": round(describe_s, 2), **json.loads(out.stdout)}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
