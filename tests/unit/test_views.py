"""The pictures and the static rendering, on small SDFGs built by hand: no compiler needed."""

import base64
import collections
import copy
import json
import pathlib
import re
import shutil
import subprocess
from html.parser import HTMLParser

import dace
import networkx as nx
import pytest
from dace.libraries.onnx.converters import clean_onnx_name
from dace.sdfg import nodes
from dace.transformation.dataflow import MapFusion, TaskletFusion

import dcnb
from dcnb._src import actions, diff, record
from dcnb._src.record import Step
from dcnb._src.timing import Timing
from dcnb._src.verify import Check
from dcnb._src.version import VERSION
from dcnb._src.views import graph, render, widget

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAYLOAD = "<img src=x onerror=alert(1)>"


def scaled_sdfg() -> dace.SDFG:
    @dace.program
    def scaled(x: dace.float32[4, 8], y: dace.float32[4, 8]):
        for i, j in dace.map[0:4, 0:8]:
            y[i, j] = 2 * x[i, j]

    return scaled.to_sdfg(simplify=True)


def two_maps_sdfg() -> dace.SDFG:
    @dace.program
    def two_maps(x: dace.float32[4, 8], y: dace.float32[4, 8]):
        t = dace.define_local([4, 8], dace.float32)
        for i, j in dace.map[0:4, 0:8]:
            t[i, j] = 2 * x[i, j]
        for i, j in dace.map[0:4, 0:8]:
            y[i, j] = t[i, j] + 1

    return two_maps.to_sdfg(simplify=True)


def nested_sdfg() -> dace.SDFG:
    @dace.program
    def inner(x: dace.float32[4, 8], y: dace.float32[4, 8]):
        for i, j in dace.map[0:4, 0:8]:
            y[i, j] = 2 * x[i, j]

    @dace.program
    def outer(x: dace.float32[4, 8], y: dace.float32[4, 8]):
        inner(x, y)

    return outer.to_sdfg(simplify=False)


def onnx_named_sdfg() -> dace.SDFG:
    """An SDFG named as DaCe's ONNX importer names one: ``ln1.weight * x`` in a state inlining split twice."""
    sdfg = dace.SDFG("Block_0123456789abcdef")
    weight, result = clean_onnx_name("ln1.weight"), clean_onnx_name("/ln1/Mul_output_0")
    sdfg.add_array("x", [4, 8], dace.float32)
    sdfg.add_array(weight, [8], dace.float32)
    sdfg.add_array(result, [4, 8], dace.float32)
    state = sdfg.add_state("block_pre_state_pre_state")
    state.add_mapped_tasklet(
        clean_onnx_name("/ln1/Mul"),
        {"i": "0:4", "j": "0:8"},
        {"a": dace.Memlet("x[i, j]"), "b": dace.Memlet(f"{weight}[j]")},
        "c = a * b",
        {"c": dace.Memlet(f"{result}[i, j]")},
        external_edges=True,
    )
    return sdfg



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
    # the widget's view collapses a picture where the static SVG does: both read the threshold from Python
    assert picture["collapse_above"] == graph.COLLAPSE_ABOVE
    (state,) = picture["states"]
    kinds = {n["kind"] for n in state["nodes"]}
    assert kinds == {"access", "map_entry", "map_exit", "tasklet"}
    entry = next(n for n in state["nodes"] if n["kind"] == "map_entry")
    tasklet = next(n for n in state["nodes"] if n["kind"] == "tasklet")
    exit_ = next(n for n in state["nodes"] if n["kind"] == "map_exit")
    assert tasklet["scope"] == entry["id"] and exit_["scope"] == entry["id"] and entry["scope"] is None
    assert entry["exit"] == exit_["id"]
    assert entry["info"]["range"] == "0:4, 0:8" and entry["info"]["parameters"] == "i, j"
    # a row of 16 vectorized 16 wide is one iteration with a step of 16, which DaCe prints as it printed 0:16
    assert graph.range_text(dace.subsets.Range([(0, 2, 1), (0, 0, 16), (4, 4, 1), (0, 15, 4)])) == "0:3, 0:1:16, 4, 0:16:4"
    assert tasklet["info"]["code"] == "__out = (dace.float32(2) * __in2)"
    x = next(n for n in state["nodes"] if n["label"] == "x")
    assert x["info"]["shape"] == "4 x 8" and x["info"]["dtype"] == "float32" and x["info"]["bytes"] == "128"
    volumes = {(e["label"], e["volume"]) for e in state["edges"]}
    assert ("x[0:4, 0:8]", "32") in volumes and ("x[i, j]", "1") in volumes
    assert graph.size(picture) == len(state["nodes"]) >= 5


def test_the_picture_names_what_dace_mangled_and_keeps_its_labels():
    sdfg = onnx_named_sdfg()
    tasklet = next(n for n in sdfg.start_state.nodes() if isinstance(n, nodes.Tasklet))
    picture = graph.describe(sdfg, metrics={tasklet.guid: {"flops": 32, "ms": 0.5}})
    assert json.loads(json.dumps(picture)) == picture
    assert (picture["name"], picture["raw"]) == ("Block", "Block_0123456789abcdef")
    (state,) = picture["states"]
    assert (state["label"], state["raw"]) == ("block", "block_pre_state_pre_state")
    drawn = {(n["kind"], n["label"]): n for n in state["nodes"]}
    # labels stay DaCe's (what `where` matches); names are the module's, and details start with DaCe's name
    weight = drawn["access", "ln1DOTweight"]
    assert weight["name"] == "ln1.weight" and next(iter(weight["info"].items())) == ("DaCe name", "ln1DOTweight")
    assert drawn["access", "SLASHln1SLASHMul_output_0"]["name"] == "ln1 · Mul output"
    assert drawn["tasklet", "SLASHln1SLASHMul"]["name"] == "ln1 · Mul"
    assert drawn["map_entry", "SLASHln1SLASHMul_map"]["name"] == "ln1 · Mul"
    assert drawn["access", "x"]["name"] == "x" and "DaCe name" not in drawn["access", "x"]["info"]
    assert {n["guid"] for n in state["nodes"]} == {n.guid for n in sdfg.start_state.nodes()}
    assert drawn["tasklet", "SLASHln1SLASHMul"]["metrics"] == {"flops": 32, "ms": 0.5}
    assert "metrics" not in weight
    # memlets name arrays readably, and the bytes they move where their volume is a number
    edges = {e["label"]: e for e in state["edges"]}
    # (a memlet's volume counts every access: the map reads each weight 4 times)
    assert edges["ln1.weight[0:8]"]["bytes"] == 4 * 8 * 4 and edges["ln1.weight[j]"]["bytes"] == 4
    assert edges["x[0:4, 0:8]"]["bytes"] == 128 and edges["x[0:4, 0:8]"]["data"] == "x"
    assert "removed" not in picture and not any("change" in n for n in state["nodes"])


def test_a_step_s_changes_are_marked_against_the_sdfg_it_was_made_from():
    naive = two_maps_sdfg()
    fused = copy.deepcopy(naive)
    assert fused.apply_transformations_repeated(MapFusion) == 1
    picture = graph.describe(fused, before=naive)
    drawn = {(n["kind"], n["label"]): n for n in graph.all_nodes(picture)}
    # the surviving map holds both tasklets now; the other map and the array between them are gone
    (entry,) = [n for n in graph.all_nodes(picture) if n["kind"] == graph.MAP_ENTRY]
    assert entry["change"] == graph.CHANGED
    removed = sorted((r["kind"], r["name"]) for r in picture["removed"])
    assert [k for k, _ in removed] == [graph.ACCESS, graph.MAP_ENTRY] and removed[0][1] == "t"
    maps = {n.map.label for n, _ in naive.all_nodes_recursive() if isinstance(n, nodes.MapEntry)}
    assert removed[1][1] in maps - {entry["name"]}
    assert all(r["state"] == picture["states"][0]["id"] for r in picture["removed"])
    # what it added: the array that replaced t inside the map (map fusion names it after t)
    assert [(n["kind"], n["name"]) for n in graph.all_nodes(picture) if n.get("change") == graph.ADDED] == [
        (graph.ACCESS, "t (fused)")
    ]
    # a deepcopy gives access nodes new guids: x and y are matched by their array, and did not change
    old_guids = {n.guid for n, _ in naive.all_nodes_recursive()}
    for name in ("x", "y"):
        assert drawn[graph.ACCESS, name]["guid"] not in old_guids and "change" not in drawn[graph.ACCESS, name]
    assert all("change" not in n for n in graph.all_nodes(picture) if n["kind"] == graph.TASKLET)
    assert all(n["guid"] in old_guids for n in graph.all_nodes(picture) if n["kind"] == graph.TASKLET)

    merged = copy.deepcopy(fused)
    assert merged.apply_transformations_repeated(TaskletFusion) == 2  # each op with its assignment
    picture = graph.describe(merged, before=fused)
    tasklets = [n for n in graph.all_nodes(picture) if n["kind"] == graph.TASKLET]
    assert sorted(n["name"] for n in tasklets) == ["Add ∘ assign_48_8", "Mult ∘ assign_46_8"]
    assert all(n["change"] == graph.ADDED and n["guid"] not in old_guids for n in tasklets)
    assert sorted(r["name"] for r in picture["removed"] if r["kind"] == graph.TASKLET) == [
        "Add", "Mult", "assign_46_8", "assign_48_8"
    ]

    edited = copy.deepcopy(merged)
    code = next(n for n, _ in edited.all_nodes_recursive() if isinstance(n, nodes.Tasklet) and "2" in n.code.as_string)
    code.code = dace.properties.CodeBlock(code.code.as_string.replace("2", "3"))
    picture = graph.describe(edited, before=merged)
    assert [n["change"] for n in graph.all_nodes(picture) if "change" in n] == [graph.CHANGED]
    assert picture["removed"] == []
    assert graph.describe(None, before=merged) is None


def _payload_picture() -> dict:
    picture = graph.describe(scaled_sdfg())
    for node in picture["states"][0]["nodes"]:
        node["label"] = PAYLOAD + node["label"]
        node["name"] = PAYLOAD + node["name"]
        node["info"] = {k: PAYLOAD for k in node["info"]}
    picture["name"] = PAYLOAD
    picture["states"][0]["label"] = PAYLOAD
    for e in picture["states"][0]["edges"]:
        e["label"] = PAYLOAD + '"\\'
    return picture


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz")
def test_the_static_svg_draws_names_as_text():
    picture = _payload_picture()
    picture["removed"] = [{"state": "s0", "name": PAYLOAD, "kind": graph.TASKLET}]
    svg = render.to_svg(picture)
    assert svg is not None and "<img" not in svg
    assert "&lt;img src=x onerror=alert(1)&gt;" in svg
    html = render.graph_img(picture)
    assert html.count("<img") == 1 and 'alt="&lt;img' in html
    assert "removed: &lt;img src=x onerror=alert(1)&gt; (tasklet)" in html
    inner = base64.b64decode(re.search(r"base64,([^\"]+)", html).group(1)).decode()
    assert inner == svg


def test_the_static_svg_draws_readable_names_and_outlines_what_a_step_changed():
    before = two_maps_sdfg()
    after = copy.deepcopy(before)
    after.apply_transformations_repeated(MapFusion)
    after.apply_transformations_repeated(TaskletFusion)
    picture = graph.describe(after, before=before)
    dot = render.to_dot(picture)
    added = [n for n in graph.all_nodes(picture) if n.get("change") == graph.ADDED]
    changed = [n for n in graph.all_nodes(picture) if n.get("change") == graph.CHANGED]
    assert added and changed
    for node in added:
        assert re.search(rf'"{node["id"]}" \[label="{re.escape(node["name"])}"[^\n]*color="#2b8a3e" penwidth=3\]', dot)
    for node in changed:
        assert re.search(rf'"{node["id"]}" \[[^\n]*color="#f59f00" penwidth=3\]', dot)
    assert dot.count("penwidth=3") == len(added) + len(changed)
    line = render.changes_html(picture)
    assert f"{len(added)} added" in line and f"{len(changed)} changed" in line
    assert f"{len(picture['removed'])} removed: t (access), " in line
    assert render.changes_html(graph.describe(after)) == ""
    # names, not labels: an importer's mangled names read as the module's
    dot = render.to_dot(graph.describe(onnx_named_sdfg()))
    assert '"ln1.weight"' in dot and '"ln1 · Mul"' in dot and "SLASH" not in dot.replace("DaCe name", "")
    assert 'label="block"' in dot


def test_nested_sdfgs_are_drawn_in_place():
    picture = graph.describe(nested_sdfg())
    (nested,) = [n for s in picture["states"] for n in s["nodes"] if n["kind"] == graph.NESTED]
    inner = nested["sdfg"]
    assert any(n["kind"] == graph.NESTED for n in graph.all_nodes(inner))  # one more inside its map
    dot = render.to_dot(picture)
    # the nested SDFG's box holds its node and its states, whose nodes are drawn inside them
    box = dot.index(f'subgraph "cluster_{nested["id"]}"')
    assert box < dot.index(f'"{nested["id"]}" [label=') < dot.index(f'subgraph "cluster_{inner["states"][-1]["id"]}"')
    assert all(f'"{node["id"]}" [label=' in dot[box:] for node in graph.all_nodes(inner))
    # a large picture shows it collapsed, as it does map scopes
    (state,) = [s for s in picture["states"] if any(n is nested for n in s["nodes"])]
    copies = graph.COLLAPSE_ABOVE // len(state["nodes"]) + 1
    big = dict(picture, states=[dict(state, id=f"c{i}") for i in range(copies)])
    assert graph.size(big) > graph.COLLAPSE_ABOVE
    dot = render.to_dot(big)
    assert f'subgraph "cluster_{nested["id"]}"' not in dot and f"({graph.size(inner)} nodes inside)" in dot


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
    assert graph.size(picture) > graph.COLLAPSE_ABOVE
    dot = render.to_dot(picture)
    assert 'subgraph "cluster_s0s0n0"' not in dot and "(5 nodes inside)" in dot


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz")
def test_a_large_picture_shows_an_overview_and_its_full_size_one_click_away():
    small = graph.describe(scaled_sdfg())
    assert render.graph_img(small).count("<img") == 1 and "<details" not in render.graph_img(small)
    (state,) = small["states"]
    large = dict(small, states=[dict(state, id=f"s{i}") for i in range(render.SCROLL_ABOVE // len(state["nodes"]) + 1)])
    assert graph.size(large) > render.SCROLL_ABOVE
    html = render.graph_img(large)
    overview, full = html.split("<details")
    assert "max-width: 100%" in overview and "overflow: auto" in overview
    assert "max-width: none" in full and "overflow: auto" in full


def test_the_history_chart_and_tables_escape():
    failed = Step(1, PAYLOAD, {}, (PAYLOAD,), ok=False, error=PAYLOAD)
    html = render.table_html(record.tabulate_history([failed])) + render.step_html(failed)
    assert "<img" not in html and "&lt;img" in html
    assert render.chart_svg([failed]) == ""


class _Tables(HTMLParser):
    """The tables of a page: each one's class and its rows, as lists of cell texts."""

    def __init__(self, html: str):
        super().__init__()
        self.tables: list[tuple[str, list[list[str]]]] = []
        self._cell: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "table":
            self.tables.append((dict(attrs).get("class", ""), []))
        elif tag == "tr":
            self.tables[-1][1].append([])
        elif tag in ("th", "td"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("th", "td"):
            self.tables[-1][1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def rows(self, kind: str) -> list[list[str]]:
        return next(rows for cls, rows in self.tables if f"dcnb-{kind}" in cls.split())


def _text_rows(lines: list[str]) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines if not line.startswith("|-")]


def _widget_rows(table: dict) -> list[list[str]]:
    return [table["columns"], *(row["cells"] for row in table["rows"])]


class _Shown:
    """What the widget and the static rendering read of a Session, over steps made up here."""

    name, title, device, recipe, forward_sdfg, backward_sdfg = "Mish", "Mish (4x8) on cpu", "cpu", [], None, None

    def __init__(self, history: list[Step]):
        self.history = history
        self.current = history[-1]

    def as_text(self) -> str:
        return "\n".join([f"dcnb session: {self.title}", *record.history_table(self.history)])

    def actions(self, where: list[str] | None = None) -> list:
        return []

    def compiled_sdfgs(self, index: int | None = None) -> tuple[None, None]:
        return None, None

    def previous_step(self, index: int | None = None) -> int | None:
        return None

    def analysis(self, index: int | None = None) -> "_NothingWorkedOut":
        return _NothingWorkedOut()


class _NothingWorkedOut:
    """A step's analysis where nothing was worked out (there are no SDFGs here to work anything out of)."""

    def known(self, name: str) -> None:
        return None


def test_the_text_the_static_html_and_the_widget_show_the_same_tables(monkeypatch):
    timings = {n: Timing.of([ms, ms * 1.5]) for n, ms in (("dcnb", 2.0), ("torch", 3.0), ("torch_compile", 2.5))}
    naive = Step(0, "naive", {}, None, ok=True, check=Check(True, 3e-7, "output", {"output": 3e-7}),
                 intermediate_bytes=3 << 20, compile_seconds=1.25, timings=timings)
    failed = Step(1, "map_fusion", {}, ("x",), ok=False, error="map_fusion matches nothing")
    fused = Step(2, "tasklet_fusion", {}, None, ok=True, intermediate_bytes=0, compile_seconds=0.0,
                 timings={"dcnb": Timing.of([1.0])})
    session = _Shown([naive, failed, fused])
    monkeypatch.setattr(widget, "INSPECT_AT_ONCE", -1)  # no SDFGs here to read the code and the metrics of
    w = widget.SessionWidget(session)
    page = _Tables(w._repr_mimebundle_()["text/html"])

    history = _widget_rows(w.history)
    assert history[0] == list(record.HISTORY_COLUMNS) and "torch.compile ms" in history[0]
    assert history[1] == ["0", "naive", "yes", "3.00e-07", "3.00", "1.2", "2.500", "3.750", "3.125", "1.50x"]
    assert history[2] == ["1", "map_fusion (where x)", "no", "map_fusion matches nothing"]
    assert history[3][:3] == ["2", "tasklet_fusion", "yes"] and history[3][-4:] == ["1.000", "", "", ""]
    assert _text_rows(record.history_table(session.history)) == history
    assert page.rows("history") == history
    assert [r["current"] for r in w.history["rows"]] == [False, False, True]

    timing = _widget_rows(w.steps[0]["timing"])
    assert timing[0] == ["", "Min", "Mean", "Median", "Stdev", "Max"]
    assert [row[0] for row in timing[1:]] == ["dcnb", "torch eager", "torch.compile"]
    assert w.steps[0]["timing"]["caption"] == "ms per forward+backward"
    assert _text_rows(record.timing_table(naive.timings)[1:]) == timing
    assert _Tables(render.step_html(naive)).rows("timing") == timing
    assert w.steps[1]["timing"]["rows"] == [] and "dcnb-timing" not in render.step_html(failed)

    # each step's line is worded once (Step.summary): the widget shows it as sent, the static HTML has its words
    assert [s["summary"] for s in w.steps] == [
        "step 0: naive · allclose: yes (max abs error 3e-07 in output) · intermediate memory: 3.00 MiB · compile: "
        "1.2 s",
        "step 1: map_fusion (where x) failed: map_fusion matches nothing",
        "step 2: tasklet_fusion · intermediate memory: 0.00 MiB · compile: 0.0 s (cached)",
    ]
    for step, sent in zip(session.history, w.steps):
        line = re.sub(r"<[^>]+>", "", render.step_html(step).split("<table")[0]).replace("&middot;", "·")
        assert line == sent["summary"]
    assert naive.as_text().splitlines()[:4] == [naive.headline, *("  " + fact for fact in naive.facts()[:3])]


def test_a_failed_steps_reason_stays_on_its_row_of_text():
    ok = Step(0, "naive", {}, None, ok=True)
    failed = Step(1, "vectorization", {}, None, ok=False, error="the generated code does not compile:\n" + "x" * 200)
    header, rule, _, reason = record.history_table([ok, failed])
    assert len(reason) == len(header) == len(rule)
    assert "does not compile: xxx" in reason and reason.endswith("… |")


def test_the_chart_shows_the_baselines_of_a_single_step():
    naive = Step(0, "naive", {}, None, ok=True, timings={n: Timing.of([ms]) for n, ms in
                                                         (("dcnb", 3.0), ("torch", 1.0), ("torch_compile", 2.0))})
    svg = render.chart_svg([naive])
    # a line through one point draws nothing: each baseline's point is a dot, named in the legend
    assert svg.count("<circle") == 2 and "torch eager" in svg and "torch.compile" in svg


def test_the_chart_goes_on_a_log_scale_where_the_medians_spread_wide(browser, artifacts):
    """A slow naive step (153 ms) beside 0.5 ms ones: on a linear scale the fast bars were a pixel high."""
    steps = [
        Step(i, name, {}, None, ok=True, timings={"dcnb": Timing.of([ms]), "torch": Timing.of([0.9])})
        for i, (name, ms) in enumerate((("naive", 153.0), ("tasklet_fusion", 0.5), ("vectorization", 0.45)))
    ]
    svg = render.chart_svg(steps)
    assert "log scale (0.15 to 168)" in svg
    heights = [float(h) for h in re.findall(r'<rect [^>]*height="([\d.]+)"', svg)]
    assert heights[0] > heights[1] > heights[2] > 10, heights
    linear = render.chart_svg(steps[1:])  # within 20x of each other: the linear scale, from zero
    assert "(top 0.99)" in linear
    page = browser.new_page()
    page.set_content(f"<body style='margin:0;background:white'>{svg}</body>")
    page.locator("svg").screenshot(path=str(artifacts / "chart-log-scale.png"))
    page.close()


def test_view_code(tmp_path):
    """The labextension's view code (layout, tables, chart, the graph view on a fake DOM) under node's test runner."""
    npm = shutil.which("npm")
    assert npm, "npm is needed to test the labextension (scripts/setup.sh installs it)"
    done = subprocess.run([npm, "test", "--silent"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"# fail 0", done.stdout)


def twin_chains_sdfg() -> dace.SDFG:
    """Two chains ``y = x * 2 + 1`` and ``w = z * 2 + 1`` whose tasklets share their labels (as ONNX expansions'
    ``_Mul_`` and ``_Add_`` do), each a map into a transient and a map out of it."""
    sdfg = dace.SDFG("twins")
    for name in ("x", "y", "z", "w"):
        sdfg.add_array(name, [4, 8], dace.float32)
    state = sdfg.add_state()
    for source, between, target in (("x", "t", "y"), ("z", "u", "w")):
        sdfg.add_transient(between, [4, 8], dace.float32)
        middle = state.add_access(between)
        for label, src, dst, code in (("_Mul_", source, between, "b = a * 2"), ("_Add_", between, target, "b = a + 1")):
            state.add_mapped_tasklet(
                label,
                {"i": "0:4", "j": "0:8"},
                {"a": dace.Memlet(f"{src}[i, j]")},
                code,
                {"b": dace.Memlet(f"{dst}[i, j]")},
                external_edges=True,
                input_nodes={between: middle} if src == between else None,
                output_nodes={between: middle} if dst == between else None,
            )
    sdfg.validate()
    return sdfg


def test_a_place_names_the_nodes_it_binds_by_guid_where_labels_repeat():
    searched = twin_chains_sdfg()
    shown = copy.deepcopy(searched)  # as the build passes draw a copy: its access nodes have new guids
    drawn = diff.counterparts(searched, shown)
    labels = collections.Counter(n["label"] for n in graph.all_nodes(graph.describe(shown)))
    (state,) = shown.states()
    chain = {node.guid: i for i, part in enumerate(nx.weakly_connected_components(state.nx)) for node in part}
    assert labels["_Add_"] == 2  # the label alone names both chains' tasklets

    for action, kinds in (("map_fusion", 3), ("tasklet_fusion", 3)):
        places = actions.get(action).places(searched, None, {})
        guids = [[drawn[n] for n in place.nodes] for place in places]
        # a place binds nodes of one chain only, both chains have one, and they share labels the view cannot
        # tell apart (the maps' or the tasklets')
        assert [len(set(g)) for g in guids] == [kinds, kinds], action
        assert sorted(len({chain[g] for g in bound}) for bound in guids) == [1, 1], action
        assert {chain[bound[0]] for bound in guids} == {0, 1}, action
        shared = [{graph.label(n) for n in place.nodes if labels[graph.label(n)] >= 2} for place in places]
        assert shared[0] and shared[0] == shared[1], action
        # applying still goes by labels: each place's name for itself tells the chains apart by their arrays
        assert [set(p.labels) & {"t", "u"} for p in places] in ([{"t"}, {"u"}], [{"u"}, {"t"}]), action


def test_a_step_applied_at_labels_is_titled_by_readable_names(monkeypatch):
    raw = (clean_onnx_name("/ln1/Mul") + "_map", clean_onnx_name("ln1.weight"))
    naive = Step(0, "naive", {}, None, ok=True)
    fused = Step(1, "map_fusion", {}, raw, ok=True)
    failed = Step(2, "vectorization", {}, raw[1:], ok=False, error="vectorization matches nothing")
    session = _Shown([naive, fused, failed])
    monkeypatch.setattr(widget, "INSPECT_AT_ONCE", -1)
    w = widget.SessionWidget(session)
    titles = ["naive", "map_fusion (where ln1 · Mul, ln1.weight)", "vectorization (where ln1.weight)"]
    assert [s["title"] for s in w.steps] == titles
    assert [row["cells"][1] for row in w.history["rows"]] == titles
    page = w._repr_mimebundle_()["text/html"]
    assert [row[1] for row in _Tables(page).rows("history")[1:]] == titles
    assert "step 2: vectorization (where ln1.weight) failed" in page and raw[1] not in page
    # DaCe's labels stay where they are applied from: the step's details and the recipe
    assert [s["where"] for s in w.steps] == [None, list(raw), [raw[1]]] and fused.where == raw
