"""The widget in a real JupyterLab: open a notebook, run the magic, see the graph, click a step, see it land."""

import json
import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from conftest import TOKEN, run_all
from playwright.sync_api import expect

pytestmark = [pytest.mark.ui, pytest.mark.compile]

PAYLOAD = "<img src=x onerror=alert(1)>"
# the live widget's view (the kernel-free drawing of the saved graphs looks alike)
LIVE = ".dcnb-session:not(.dcnb-kernel-free)"
CELLS = [
    "%load_ext dcnb\nimport torch\nfrom torch import nn\nimport torch.nn.functional as F",
    """%%dcoptimize --inputs torch.rand(2,4,16,16) --baselines torch --time-budget 0.2
class Mish(nn.Module):
    def forward(self, x):
        return x * torch.tanh(F.softplus(x))""",
    # names are text, never markup: a module class, a node and a message that hold HTML
    f"""from dcnb._src.views.widget import SessionWidget
Evil = type({PAYLOAD!r}, (Mish,), {{}})
w = SessionWidget(mish_opt, variable="evil")
g = dict(w.graphs)
g["forward"]["states"][0]["nodes"][0]["label"] = {PAYLOAD!r}
g["forward"]["states"][0]["label"] = {PAYLOAD!r}
w.graphs = {{}}
w.graphs = g
w.title = Evil.__name__
w.message = {PAYLOAD!r}
w""",
    # a picture of thousands of nodes (twenty copies of the backward's states) is laid out off the main thread
    """big = SessionWidget(mish_opt, variable="big")
g = dict(big.graphs)
states = g["backward"]["states"]
copies = []
for i in range(20):
    rename = lambda name, i=i: name and f"c{i}{name}"
    for s in states:
        copies.append(dict(s, id=rename(s["id"]),
            nodes=[dict(n, id=rename(n["id"]), scope=rename(n["scope"]), exit=rename(n.get("exit"))) for n in s["nodes"]],
            edges=[dict(e, src=rename(e["src"]), dst=rename(e["dst"])) for e in s["edges"]]))
chain = [{"src": a["id"], "dst": b["id"], "label": ""} for a, b in zip(copies, copies[1:])]
g["backward"] = dict(g["backward"], states=copies, interstate=chain)
big.graphs = g
big""",
]


def test_run_the_magic_see_the_graph_click_a_step(lab, browser, page, artifacts):
    base, folder = lab
    kernel = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb = new_notebook(cells=[new_code_cell(c) for c in CELLS], metadata={"kernelspec": kernel})
    nbformat.write(nb, folder / "mish.ipynb")
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(f"{base}/lab/tree/mish.ipynb?token={TOKEN}")
    run_all(page, "mish.ipynb")

    session = page.locator(LIVE).first
    session.locator(".dcnb-node").first.wait_for(timeout=180_000)
    assert session.locator(".dcnb-node.dcnb-tasklet").count() >= 1
    assert session.locator(".dcnb-history tr.dcnb-ok").count() == 1
    assert "dcnb session mish_opt: Mish (2x4x16x16) on cpu" in session.locator(".dcnb-title").inner_text()
    session.scroll_into_view_if_needed()
    session.screenshot(path=str(artifacts / "ui-naive.png"))

    # the backward tab draws the backward SDFG
    session.locator("button[data-tab=backward]").click()
    session.locator(".dcnb-node.dcnb-map_entry").first.wait_for()
    # a click on a node shows its details
    session.locator(".dcnb-node.dcnb-access").first.click()
    assert "shape" in session.locator(".dcnb-details").inner_text()
    # selecting it narrows the actions to it: nothing matches an output array alone
    expect(session.locator("button[data-action=tasklet_fusion]")).to_be_disabled(timeout=60_000)
    session.locator(".dcnb-selection button").click()  # clear the selection again
    session.locator("button[data-tab=forward]").click()

    button = session.locator("button[data-action=tasklet_fusion]")
    expect(button).to_be_enabled(timeout=60_000)
    expect(session.locator("button[data-action=expand]")).to_be_disabled()
    button.click()
    page.wait_for_function(
        "() => document.querySelectorAll('.dcnb-session:not(.dcnb-kernel-free)')[0].querySelectorAll('.dcnb-history tr.dcnb-ok').length === 2",
        timeout=180_000,
    )
    rows = session.locator(".dcnb-history tr.dcnb-ok")
    assert "tasklet_fusion" in rows.nth(1).inner_text() and "yes" in rows.nth(1).inner_text()
    assert "intermediate memory: 0.00 MiB" in session.locator(".dcnb-summary").inner_text()
    session.locator(".dcnb-timing").wait_for()
    session.screenshot(path=str(artifacts / "ui-tasklet-fusion.png"))
    # the tables as the kernel formatted them: the static rendering shows the same ones (below)
    tables = {kind: session.locator(f".dcnb-{kind} tr").all_inner_texts() for kind in ("history", "timing")}
    assert "torch.compile ms" in tables["history"][0] and tables["timing"][2].startswith("torch eager")

    # the payloads arrive as text
    evil = page.locator(LIVE).nth(1)
    evil.locator(".dcnb-node").first.wait_for(timeout=60_000)
    assert PAYLOAD in evil.locator(".dcnb-title").inner_text()
    assert PAYLOAD in evil.locator(".dcnb-status").inner_text()
    assert evil.locator(f"g.dcnb-node[data-label='{PAYLOAD}']").count() == 1
    assert page.locator(".dcnb-session img").count() == 0 and dialogs == []
    evil.screenshot(path=str(artifacts / "ui-escaped.png"))

    # the large picture: drawn with its scopes collapsed, laid out in the worker
    big = page.locator(LIVE).nth(2)
    big.locator("button[data-tab=backward]").click()
    expect(big.locator(".dcnb-node.dcnb-map_entry").first).to_be_visible(timeout=60_000)
    expect(big.locator(".dcnb-notice")).to_be_hidden()
    assert big.locator(".dcnb-node").count() > 20 * 5 and big.locator(".dcnb-node.dcnb-tasklet").count() == 0
    big.locator(".dcnb-map_entry .dcnb-toggle").first.click()  # expand one map scope: its tasklet appears
    expect(big.locator(".dcnb-node.dcnb-tasklet").first).to_be_visible(timeout=60_000)
    big.screenshot(path=str(artifacts / "ui-large.png"))

    # saved, the notebook carries the static rendering of the current state, for readers without a kernel
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_timeout(1500)
    saved = json.loads((folder / "mish.ipynb").read_text())
    html = "".join(
        next(o["data"]["text/html"] for o in saved["cells"][1]["outputs"] if "text/html" in o.get("data", {}))
    )
    assert "tasklet_fusion" in html and html.count("data:image/svg+xml") == 2
    # a reader whose kernel is gone (here: a fresh kernel, which holds no widgets) sees the static rendering
    import urllib.request

    def call(method, path):
        request = urllib.request.Request(f"{base}{path}?token={TOKEN}", method=method)
        with urllib.request.urlopen(request) as answer:
            return json.loads(answer.read() or b"null")

    for live in call("GET", "/api/sessions"):
        call("DELETE", f"/api/sessions/{live['id']}")
    page.reload()
    output = page.locator(".dcnb-output").first
    # the saved graphs are drawn as the widget draws them, in place of the static SVGs; the tables stay
    expect(output.locator(".dcnb-kernel-free .dcnb-node").first).to_be_visible(timeout=60_000)
    expect(output.locator(".dcnb-static-output img").first).to_be_hidden()
    assert page.locator(LIVE).count() == 0
    assert "tasklet_fusion" in output.locator(".dcnb-history").inner_text()
    for kind, rows in tables.items():
        assert output.locator(f".dcnb-static-output .dcnb-{kind} tr").all_inner_texts() == rows
    # a click still shows a node's details
    free = output.locator(".dcnb-kernel-free")
    free.locator(".dcnb-node.dcnb-tasklet").first.click()
    assert "code" in free.locator(".dcnb-details").inner_text()
    output.screenshot(path=str(artifacts / "ui-without-kernel.png"))

    exported = subprocess.run(
        [sys.executable, "-m", "nbconvert", "--to", "html", str(folder / "mish.ipynb"), "--output-dir", str(artifacts)],
        capture_output=True, text=True, timeout=120,
    )
    assert exported.returncode == 0, exported.stderr
    static = browser.new_page()
    static.goto((artifacts / "mish.html").as_uri())
    static.locator(".dcnb-static img").first.wait_for()
    assert static.locator(".dcnb-history").first.is_visible()
    static.screenshot(path=str(artifacts / "nbconvert.png"), full_page=True)
    static.close()
