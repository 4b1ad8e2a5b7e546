"""The pictures and the static rendering, on small SDFGs built by hand: no compiler needed."""

import base64
import json
import pathlib
import re
import shutil
import subprocess

import dace
import pytest

import dcnb
from dcnb._src import graph, render, widget
from dcnb._src.version import VERSION

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAYLOAD = "<img src=x onerror=alert(1)>"


def scaled_sdfg() -> dace.SDFG:
    @dace.program
    def scaled(x: dace.float32[4, 8], y: dace.float32[4, 8]):
        for i, j in dace.map[0:4, 0:8]:
            y[i, j] = 2 * x[i, j]

    return scaled.to_sdfg(simplify=True)


def test_versions_agree():
    package = json.loads((ROOT / "package.json").read_text())
    assert package["version"] == VERSION == dcnb.__version__
    assert widget.SessionWidget._model_module_version.default_value == VERSION
    ts = (ROOT / "labextension" / "src" / "version.ts").read_text()
    assert f"MODULE_VERSION = '{VERSION}'" in ts
    assert package["jupyterlab"]["outputDir"] == "dcnb/labextension"


def test_the_picture_has_scopes_memlets_and_details():
    picture = graph.describe(scaled_sdfg())
    assert json.loads(json.dumps(picture)) == picture
    (state,) = picture["states"]
    kinds = {n["kind"] for n in state["nodes"]}
    assert kinds == {"access", "map_entry", "map_exit", "tasklet"}
    entry = next(n for n in state["nodes"] if n["kind"] == "map_entry")
    tasklet = next(n for n in state["nodes"] if n["kind"] == "tasklet")
    exit_ = next(n for n in state["nodes"] if n["kind"] == "map_exit")
    assert tasklet["scope"] == entry["id"] and exit_["scope"] == entry["id"] and entry["scope"] is None
    assert entry["exit"] == exit_["id"]
    assert entry["info"]["range"] == "0:4, 0:8" and entry["info"]["parameters"] == "i, j"
    assert tasklet["info"]["code"] == "__out = (dace.float32(2) * __in2)"
    x = next(n for n in state["nodes"] if n["label"] == "x")
    assert x["info"]["shape"] == "4 x 8" and x["info"]["dtype"] == "float32" and x["info"]["bytes"] == "128"
    volumes = {(e["label"], e["volume"]) for e in state["edges"]}
    assert ("x[0:4, 0:8]", "32") in volumes and ("x[i, j]", "1") in volumes
    assert graph.size(picture) == len(state["nodes"]) >= 5


def _payload_picture() -> dict:
    picture = graph.describe(scaled_sdfg())
    for node in picture["states"][0]["nodes"]:
        node["label"] = PAYLOAD + node["label"]
        node["info"] = {k: PAYLOAD for k in node["info"]}
    picture["name"] = PAYLOAD
    picture["states"][0]["label"] = PAYLOAD
    for e in picture["states"][0]["edges"]:
        e["label"] = PAYLOAD + '"\\'
    return picture


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz")
def test_the_static_svg_draws_names_as_text():
    picture = _payload_picture()
    svg = render.to_svg(picture)
    assert svg is not None and "<img" not in svg
    assert "&lt;img src=x onerror=alert(1)&gt;" in svg
    html = render.graph_img(picture)
    assert html.count("<img") == 1 and 'alt="&lt;img' in html
    inner = base64.b64decode(re.search(r"base64,([^\"]+)", html).group(1)).decode()
    assert inner == svg


def test_large_pictures_collapse_outer_maps_in_the_static_svg():
    picture = graph.describe(scaled_sdfg())
    assert 'subgraph "cluster_s0n0"' in render.to_dot(picture)  # the map scope is drawn as a cluster
    (state,) = picture["states"]

    def copy(i: int) -> dict:
        prefix = lambda name: name and f"s{i}{name}"  # noqa: E731
        nodes = [dict(n, id=prefix(n["id"]), scope=prefix(n["scope"])) for n in state["nodes"]]
        edges = [dict(e, src=prefix(e["src"]), dst=prefix(e["dst"])) for e in state["edges"]]
        return dict(state, id=f"s{i}", nodes=nodes, edges=edges)

    picture["states"] = [copy(i) for i in range(60)]
    assert graph.size(picture) > render.COLLAPSE_ABOVE
    dot = render.to_dot(picture)
    assert 'subgraph "cluster_s0s0n0"' not in dot and "(5 nodes inside)" in dot


def test_the_history_chart_and_tables_escape(monkeypatch):
    from dcnb._src.record import Step

    failed = Step(1, PAYLOAD, {}, (PAYLOAD,), ok=False, error=PAYLOAD)
    html = render.history_html([failed]) + render.step_html(failed)
    assert "<img" not in html and "&lt;img" in html
    assert render.chart_svg([failed]) == ""


def test_view_code(tmp_path):
    """The labextension's pure view code (layout, formatting) under node's test runner."""
    npm = shutil.which("npm")
    assert npm, "npm is needed to test the labextension (scripts/setup.sh installs it)"
    done = subprocess.run([npm, "test", "--silent"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"# fail 0", done.stdout)
