"""How the session widget copes with large SDFGs: a BERT-style encoder layer (and a stack of six) and two ResNets
(transformers' ResNet with the zoo's tiny widths: the zoo's two stages of one basic block, and ResNet-18's four
stages of two), forward and backward. For each picture: its size, and how long the view's layout takes on it (the
view's own code, under node; median of 5 after a warm-up) as it opens (the scopes `defaultCollapsed` closes), with
every scope collapsed and with every scope expanded. ``--browser`` also opens the ResNet-18's pictures in a real
JupyterLab in headless Chromium and times what a user waits for there. ``--json`` prints one line.

    .venv/bin/python benchmarks/view.py --json [--browser]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import tempfile
import time
import warnings

import torch
from torch import nn

from dcnb._src import passes, program
from dcnb._src.frontend import import_module
from dcnb._src.views import graph

ROOT = pathlib.Path(__file__).resolve().parents[1]

LAYOUT = """
const { layoutGraph, scopeIds, countNodes, defaultCollapsed } = require(process.argv[1] + '/labextension/lib-test/layout.js');
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
    return Math.round(times[2]);
  };
  const opening = defaultCollapsed(g);
  result[name] = {
    nodes: countNodes(g),
    // the nodes drawn as the picture opens, and its layout then
    shown: layoutGraph(g, opening).nodes.length,
    opening_ms: runs(opening),
    collapsed_ms: runs(new Set(scopeIds(g))),
    expanded_ms: runs(new Set())
  };
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


def _describe(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[dict, dict]:
    """The pictures of a module's forward and backward SDFGs, as the widget gets them for step 0."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        imported = import_module(model.eval(), inputs, training=False)
        passes.run(passes.ON_IMPORT, imported.sdfg)
        prog = program.differentiate(imported.sdfg, imported, imported.inputs + list(imported.param_paths))
    return graph.describe(prog.forward), graph.describe(prog.backward)


def encoder_pictures(d_model: int, heads: int, seq: int, batch: int) -> dict:
    """The SDFGs of one encoder layer and of a stack of six (a small transformer: thousands of nodes)."""
    x = torch.rand(batch, seq, d_model)
    result = {}
    for layers in (1, 6):
        model = nn.Sequential(*(EncoderLayer(d_model, heads) for _ in range(layers)))
        result[f"layers{layers}_forward"], result[f"layers{layers}_backward"] = _describe(model, (x,))
    return result


def resnet_pictures() -> dict:
    """The SDFGs of transformers' ResNet at tests/hf_models.py's widths (a picture's size depends on the layers,
    not on the widths or the 32x32 images, which keep the export cheap): the zoo's two stages, ResNet-18's four."""
    from transformers import ResNetConfig, ResNetForImageClassification

    images = (torch.rand(2, 3, 32, 32),)
    result = {}
    for name, hidden, depths in (("resnet_zoo", [8, 16], [1, 1]), ("resnet18", [8, 16, 32, 64], [2, 2, 2, 2])):
        torch.manual_seed(0)
        config = ResNetConfig(
            embedding_size=8, hidden_sizes=hidden, depths=depths, layer_type="basic", num_labels=5,
            downsample_in_first_stage=False,
        )
        result[f"{name}_forward"], result[f"{name}_backward"] = _describe(
            ResNetForImageClassification(config), images
        )
    return result


# --- in a real JupyterLab ---------------------------------------------------------------------------------------

# A session widget showing the pictures in pictures.json: a real session of a small module (its own build is cheap
# and cached), whose `graphs` then hold the large pictures, as the view would get them from that model's session.
BROWSER_CELLS = [
    (
        "import json, torch, dcnb\nfrom torch import nn\nfrom dcnb._src.views.widget import SessionWidget\n"
        "session = dcnb.optimize(nn.Tanh(), torch.rand(2, 8), baselines=('torch',), time_budget=0.1)"
    ),
    "view = SessionWidget(session, variable='view')\nview.graphs = json.load(open('pictures.json'))\nview",
]

# Open the backward tab and wait, frame by frame, until its layout is drawn and some node lies in the canvas; the
# longest task the main thread ran meanwhile (how long the notebook could not answer the user).
OPEN_BACKWARD = """async root => {
    const tasks = [];
    const observer = new PerformanceObserver(list => list.getEntries().forEach(e => tasks.push(e.duration)));
    observer.observe({ type: 'longtask' });
    const notice = root.querySelector('.dcnb-notice');
    const canvas = root.querySelector('.dcnb-canvas');
    const inView = () => {
        const c = canvas.getBoundingClientRect();
        return [...root.querySelectorAll('g.dcnb-node')].some(g => {
            const b = g.getBoundingClientRect();
            return b.width > 0 && b.right > c.left && b.left < c.right && b.bottom > c.top && b.top < c.bottom;
        });
    };
    const frame = () => new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));
    const start = performance.now();
    root.querySelector('button[data-tab=backward]').click();
    while (notice.style.display !== 'none' || !inView()) {
        await frame();
    }
    await frame();
    const ms = performance.now() - start;
    await new Promise(r => setTimeout(r, 50));
    observer.disconnect();
    return { ms, longest_task_ms: Math.max(0, ...tasks), drawn: root.querySelectorAll('g.dcnb-node').length };
}"""

# The time of one frame of zoom (a wheel turn) and of pan (a drag step): from the event until the frame that
# shows it has gone by (requestAnimationFrame, then a task after it); a 60 Hz display gives at least 16.7 ms.
PAN_ZOOM = """async root => {
    const canvas = root.querySelector('.dcnb-canvas');
    const box = canvas.getBoundingClientRect();
    const at = { clientX: box.left + box.width / 2, clientY: box.top + box.height / 2, bubbles: true, cancelable: true };
    const frame = () => new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));
    const timed = async send => {
        const times = [];
        for (let i = 0; i < 30; i++) {
            const t = performance.now();
            send(i);
            await frame();
            times.push(performance.now() - t);
        }
        times.sort((a, b) => a - b);
        return times[15];
    };
    const zoom = await timed(i => canvas.dispatchEvent(new WheelEvent('wheel', { ...at, deltaY: i % 2 ? 100 : -100 })));
    canvas.dispatchEvent(new MouseEvent('mousedown', at));
    const pan = await timed(i => window.dispatchEvent(new MouseEvent('mousemove', { ...at, clientX: at.clientX + 5 * (i + 1) })));
    window.dispatchEvent(new MouseEvent('mouseup', at));
    return { zoom_ms: zoom, pan_ms: pan };
}"""


def browser(forward: dict, backward: dict, repeats: int = 3) -> dict:
    """Open the backward tab of a session view showing these pictures `repeats` times (back on the forward tab in
    between) and time it; then zoom and pan it, as it opened and fitted whole (every node painted)."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook
    from playwright.sync_api import sync_playwright

    from tests import conftest as tests
    from tests.ui import conftest as ui
    with tempfile.TemporaryDirectory() as tmp:
        folder, home = pathlib.Path(tmp, "lab"), pathlib.Path(tmp, "home")
        folder.mkdir()
        home.mkdir()
        (folder / "pictures.json").write_text(json.dumps({"forward": forward, "backward": backward}))
        kernel = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
        notebook = new_notebook(cells=[new_code_cell(c) for c in BROWSER_CELLS], metadata={"kernelspec": kernel})
        nbformat.write(notebook, folder / "view.ipynb")
        with ui.serve_lab(folder, home) as base, sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                str(home / "chromium"), executable_path=tests.CHROMIUM, headless=True, args=tests.CHROMIUM_FLAGS,
                viewport={"width": 1400, "height": 1100},
            )
            page = context.new_page()
            errors = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{base}/lab/tree/view.ipynb?token={ui.TOKEN}")
            ui.run_all(page, "view.ipynb")
            view = page.locator(".dcnb-session:not(.dcnb-kernel-free)").first
            try:
                view.locator(".dcnb-node").first.wait_for(state="attached", timeout=300_000)
            except Exception as e:
                seen = page.locator(".jp-OutputArea-output").all_inner_texts()
                raise RuntimeError(f"the view drew no node: {seen}, console: {errors}") from e
            view.scroll_into_view_if_needed()
            (ROOT / "test-artifacts").mkdir(exist_ok=True)
            page.screenshot(path=str(ROOT / "test-artifacts" / "view-bench-resnet18-forward.png"))
            opened = []
            for i in range(repeats):
                if i:
                    view.locator("button[data-tab=forward]").click()
                    page.wait_for_function(
                        "root => root.querySelector('.dcnb-notice').style.display === 'none'", arg=view.element_handle(),
                        timeout=120_000,
                    )
                opened.append(view.evaluate(OPEN_BACKWARD))
            as_opened = view.evaluate(PAN_ZOOM)
            view.get_by_role("button", name="Fit").click()
            whole = view.evaluate(PAN_ZOOM)
            page.screenshot(path=str(ROOT / "test-artifacts" / "view-bench-resnet18-backward.png"))
            context.close()
    return {
        "open_backward_ms": round(statistics.median(o["ms"] for o in opened)),
        "open_backward_runs_ms": [round(o["ms"]) for o in opened],
        "longest_main_thread_task_ms": round(max(o["longest_task_ms"] for o in opened)),
        "drawn_nodes": opened[-1]["drawn"],
        "zoom_frame_ms": round(as_opened["zoom_ms"], 1),
        "pan_frame_ms": round(as_opened["pan_ms"], 1),
        "zoom_frame_fit_ms": round(whole["zoom_ms"], 1),
        "pan_frame_fit_ms": round(whole["pan_ms"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--browser", action="store_true", help="also time the ResNet-18's backward in JupyterLab")
    args = parser.parse_args()
    start = time.perf_counter()
    data = encoder_pictures(d_model=64, heads=4, seq=16, batch=2)
    encoder_s = time.perf_counter() - start
    data.update(resnet_pictures())
    resnet_s = time.perf_counter() - start - encoder_s
    subprocess.run(["npx", "--no-install", "tsc", "-p", "labextension/tsconfig.test.json"], cwd=ROOT, check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(data, f)
        f.flush()
        size = pathlib.Path(f.name).stat().st_size
        out = subprocess.run(["node", "-e", LAYOUT, str(ROOT), f.name], capture_output=True, text=True, check=True)
    result = {
        "models": "BERT-style encoder layers (d=64, 4 heads, ff=256), 2x16x64; transformers' ResNet (basic blocks, "
        "widths 8-64), 2x3x32x32: resnet_zoo = 2 stages of 1 block, resnet18 = 4 stages of 2",
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "json_bytes": size,
        "import_and_autodiff_s": {"encoder": round(encoder_s, 2), "resnet": round(resnet_s, 2)},
        **json.loads(out.stdout),
    }
    if args.browser:
        result["browser_resnet18"] = browser(data["resnet18_forward"], data["resnet18_backward"])
        result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
