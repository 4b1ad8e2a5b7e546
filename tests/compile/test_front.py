"""The magic and the widget over real sessions: builds, requests from the view, the recipe, the static view."""

import base64
import html
import json
import os
import pathlib
import re
import signal
import threading
import time

import pytest
import torch
from IPython.core.error import UsageError

import dcnb
from dcnb._src.views import graph, render, widget
from dcnb._src.views.widget import Progress, SessionWidget
from tests import processes
from tests.models import Mish

pytestmark = pytest.mark.compile

MISH_CELL = """
import torch.nn.functional as F
class Mish(nn.Module):
    def forward(self, x):
        return x * torch.tanh(F.softplus(x))
"""
FAST = "--inputs torch.rand(2,4,8,8) --baselines '' --time-budget 0.05"


@pytest.fixture(scope="module")
def session():
    torch.manual_seed(0)
    return dcnb.optimize(Mish(), torch.rand(2, 4, 8, 8), baselines=("torch",), time_budget=0.05)


def test_the_magic_builds_binds_and_shows(ip, capsys):
    ip.run_cell_magic("dcoptimize", FAST, MISH_CELL)
    session = ip.user_ns["mish_opt"]
    assert isinstance(session, dcnb.Session) and session.current.ok
    assert isinstance(ip.user_ns["Mish"], type)
    out = capsys.readouterr().out
    # progress while it works: outside a kernel, a line per phase (no ticks)
    assert "dcnb: Mish: preparing the backward pass for the compiler (" in out and "in this phase" not in out
    assert "dcnb session: Mish (2x4x8x8) on cpu" in out  # the widget's text/plain outside Jupyter


def test_the_magic_names_an_unsupported_op(ip):
    cell = "class Det(nn.Module):\n    def forward(self, x):\n        return torch.det(x)\n"
    with pytest.raises(UsageError) as raised:
        ip.run_cell_magic("dcoptimize", "--inputs torch.rand(3,3) --baselines ''", cell)
    message = str(raised.value)
    assert message.startswith("Det: ") and "Det" in message[5:] and "\n" not in message
    assert "det" in message.lower().split(":", 1)[1]


def _request(widget: SessionWidget, **content) -> None:
    """Deliver a message as the browser's view sends it, through the comm's handler."""
    widget._handle_msg({"content": {"data": {"method": "custom", "content": content}}, "buffers": []})


def test_the_widget_mirrors_the_session_and_answers_requests(session, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = SessionWidget(session, variable="mish_opt")
    assert w.title == "Mish (2x4x8x8) on cpu"
    assert w.graphs["forward"]["states"] and w.graphs["backward"]["states"]
    offers = {a["name"]: a for a in w.actions}
    assert offers["tasklet_fusion"]["matches"] > 0 and offers["tasklet_fusion"]["before_autodiff"]
    assert [s["name"] for s in w.steps] == ["naive"] and w.steps[0]["timings"]["torch"]["median"] > 0

    # selecting a node narrows where the actions apply: an array no map touches matches nothing
    w.selection = ["no_such_node"]
    assert all(a["matches"] == 0 for a in w.actions)
    w.selection = []

    before = w.graphs
    _request(w, event="apply", name="map_fusion", where=["no_such_node"])  # a failed step, rolled back
    assert w.steps[-1]["ok"] is False
    assert w.message == "step 1: map_fusion (where no_such_node) failed: map_fusion matches nothing in the forward or backward SDFG"
    assert w.graphs == before and w.current == 0

    _request(w, event="apply", name="tasklet_fusion")
    assert w.steps[-1]["ok"] and w.current == 2 and w.busy == ""
    assert w.steps[-1]["intermediate_bytes"] == 0 and w.graphs != before
    assert json.loads(w.recipe) == [{"name": "tasklet_fusion"}]

    _request(w, event="export")
    assert json.loads((tmp_path / "mish_opt.recipe.json").read_text()) == [{"name": "tasklet_fusion"}]
    assert "--recipe mish_opt.recipe.json" in w.message

    _request(w, event="undo")
    assert w.current == 0 and w.graphs == before and w.message == "back at step 0"
    _request(w, event="apply", name="map_fusion")
    _request(w, event="reset")
    assert [s["name"] for s in w.steps] == ["naive"]


def _heat(page: str, metric: str) -> bool:
    """Whether a graph of the static ``page`` fills nodes with heat colours, ``metric`` in their tooltips."""
    svgs = [base64.b64decode(m).decode() for m in re.findall(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)", page)]
    pathlib.Path(f"/tmp/dcnb-static-{metric}.html").write_text(page)  # (to look at)
    fills = [bytes.fromhex(f) for svg in svgs for f in re.findall(r'fill="#([0-9a-f]{6})"', svg)]
    # yellow to dark red (render.HEAT_COLOURS), which no node's plain fill is
    heated = [(r, g, b) for r, g, b in fills if r >= 0xBD and r >= g >= b and b <= 0xB2]
    tooltips = any(re.search(rf'xlink:title="[^"]*{metric} \d', svg) for svg in svgs)
    # (an image shows no tooltips: the hottest nodes' numbers are listed under it)
    listed = re.search(rf"<ul class='dcnb-hottest'[^>]*><li>[^<]*: [^<]*{metric} \d", page)
    return bool(heated) and tooltips and bool(listed)


def _children() -> list[int]:
    """This process's children that still run."""
    return processes.live(processes.PPID, os.getpid())


def test_one_match_a_step_against_its_parent_code_profile_and_cancel(fresh_cache, monkeypatch):
    progress = Progress()
    # a shape of its own: a build this process made before is not compiled again, and this test needs a compiler
    session = dcnb.optimize(Mish(), torch.rand(3, 5, 7), baselines=(), time_budget=0.0, progress=progress)
    w = SessionWidget(session, progress=progress)
    places = w.matches["map_fusion"]
    assert len(places) >= 2 and all(p["side"] in ("forward", "backward") and p["labels"] for p in places)
    # each place marks the nodes it binds in the picture drawn now (what the view highlights on hover)
    for p in places:
        drawn = {n["guid"]: n for n in graph.all_nodes(w.graphs[p["side"]])}
        assert p["guids"] and set(p["guids"]) <= set(drawn), p
        assert {drawn[g]["label"] for g in p["guids"]} >= set(p["labels"]), p

    # one match: applied there only, and the recipe names where
    _request(w, event="apply", name="map_fusion", match=1)
    assert w.steps[-1]["ok"] and w.steps[-1]["applied"] == 1, w.message
    assert len(w.matches["map_fusion"]) == len(places) - 1
    assert json.loads(w.recipe) == [{"name": "map_fusion", "where": places[1]["labels"]}]
    _request(w, event="apply", name="map_fusion", match=99)
    assert w.message == f"map_fusion has no match 99 now (it matches {len(places) - 1} place(s))" and w.current == 1

    # the step is drawn against the naive step it was made from, which the view can show instead
    assert w.shown == 1 and w.before["step"] == 0
    fused = w.graphs["forward"]
    assert fused.get("removed") and any(n.get("change") == "added" for s in fused["states"] for n in s["nodes"])
    _request(w, event="show", index=0)
    assert w.shown == 0 and w.current == 1 and w.before == {} and "change" not in json.dumps(w.graphs)
    _request(w, event="show", index=None)
    assert w.shown == 1 and w.graphs == {"forward": fused, "backward": w.graphs["backward"]}

    # a small graph comes with its generated code and its nodes' bytes and FLOPs; a large one when the view asks
    assert w.sources["forward"]["nodes"] and w.sources["backward"]["nodes"]
    assert any("flops" in n.get("metrics", {}) for n in graph.all_nodes(w.graphs["forward"]))
    monkeypatch.setattr(widget, "INSPECT_AT_ONCE", 0)
    _request(w, event="apply", name="map_fusion", match=0)
    assert w.current == 2 and w.sources == {} and "metrics" not in json.dumps(w.graphs)
    _request(w, event="inspect")
    assert w.sources["forward"]["nodes"] and "metrics" in json.dumps(w.graphs)
    # the saved rendering shows what the widget worked out: bytes as a heat colouring, the numbers as tooltips
    page = w._repr_mimebundle_()["text/html"]
    assert _heat(page, "bytes") and "dcnb-kernels" not in page
    # a profile: each kernel's time, in the table and on the nodes of the graph (the pictures drawn once)
    described = []
    with monkeypatch.context() as spied:  # (undoing ``monkeypatch`` itself would undo fresh_cache's DCNB_CACHE too)
        spied.setattr(graph, "describe", lambda *a, _d=graph.describe, **k: described.append(a) or _d(*a, **k))
        _request(w, event="profile")
    assert len(described) == 4, "the step's two pictures and the two of the step it was made from, once each"
    assert w.profile["step"] == 2 and w.profile["rows"] and w.profile["eager"], w.message
    timed = {n["guid"] for n in graph.all_nodes(w.graphs["forward"]) if "ms" in n.get("metrics", {})}
    assert timed and timed <= {guid for row in w.profile["rows"] for guid in row["guids"]}
    # and in the saved rendering: the kernels table as the widget names them, the graph coloured by time
    page = w._repr_mimebundle_()["text/html"]
    kernels = re.search(r"<table class='[^']*dcnb-kernels.*?</table>", page, re.DOTALL)
    assert kernels and all(f">{html.escape(r['name'])}<" in kernels[0] for r in w.profile["rows"][:10])
    assert "dcnb-eager" in page and _heat(page, "time")
    _request(w, event="undo")
    assert w.profile == {} and w.current == 1

    # Cancel interrupts the kernel while a step compiles: the compiler stops, the step is recorded as cancelled
    # and the session stays where it was
    running = set(_children())  # (torch.compile's workers, say)

    def interrupt() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if re.search(r"compil(e|ing) ", w.busy) and set(_children()) - running:
                os.kill(os.getpid(), signal.SIGINT)  # once a compiler runs: as the kernel's interrupt arrives
                return
            time.sleep(0.01)

    threading.Thread(target=interrupt, daemon=True).start()
    _request(w, event="apply", name="tasklet_fusion")
    assert re.fullmatch(r"cancelled while compiling after \d+ s; the session stays at step 1", w.message), w.message
    assert w.busy == "" and w.current == 1 and not w.steps[-1]["ok"] and w.steps[-1]["name"] == "tasklet_fusion"
    assert set(_children()) <= running
    assert session.apply("tasklet_fusion").ok  # and the session goes on


def test_an_exported_recipe_replays_through_the_magic(ip, tmp_path):
    recipe = tmp_path / "mish.json"
    recipe.write_text(json.dumps([{"name": "tasklet_fusion"}]))
    ip.run_cell_magic("dcoptimize", f"{FAST} --recipe {recipe} --as replayed", MISH_CELL)
    assert [s.name for s in ip.user_ns["replayed"].history] == ["naive", "tasklet_fusion"]
    assert ip.user_ns["replayed"].recipe == [{"name": "tasklet_fusion"}]


def test_the_magic_searches_and_the_view_shows_the_candidates(ip, capsys):
    timed = "--inputs torch.rand(2,4,8,8) --baselines torch --time-budget 0.05"
    ip.run_cell_magic("dcoptimize", f"{timed} --search 6 --as searched", MISH_CELL)
    found = ip.user_ns["searched"]
    out = capsys.readouterr().out
    # the progress line follows the candidates with the time left and the best so far
    assert re.search(r"search, candidate 1 \(\d+ s left; best so far #0 start, [\d.]+x vs torch\)", out), out
    assert found.current.ok and len(found.history) >= 1
    # the view's Search: candidates in a table and a plot of time against memory, the best as steps
    w = SessionWidget(found, variable="searched")
    _request(w, event="search", budget=4)
    assert w.message.startswith("search for time (beam 3, depth open, places 3, seed 0): ") and "best: " in w.message
    rows, points = w.search["table"]["rows"], w.search["points"]
    assert rows and len(rows) >= len(points) >= 1 and rows[0]["cells"][2] == "start"
    assert sum(p["best"] for p in points) == 1 and any(p["front"] for p in points)
    assert all(p["unit"] == "x eager" and p["time"] > 0 for p in points)
    _request(w, event="search", budget="soon")
    assert w.message == "a search needs a budget in seconds (got 'soon')"
    with pytest.raises(UsageError, match="--search 0: give the seconds"):
        ip.run_cell_magic("dcoptimize", f"{FAST} --search 0", MISH_CELL)


def test_the_static_view_shows_graphs_and_tables(session):
    html = render.to_html(session)
    assert html.count("<img") == 2 and "Forward SDFG" in html and "Backward SDFG" in html
    assert "dcnb-history" in html and "torch eager" in html and "Median" in html
    bundle = SessionWidget(session)._repr_mimebundle_()
    assert {"text/plain", "text/html", "application/vnd.jupyter.widget-view+json"} <= set(bundle)
    assert bundle["application/vnd.dcnb.session+json"]["model_id"] == bundle["application/vnd.jupyter.widget-view+json"]["model_id"]


def test_a_step_that_does_not_compile_keeps_its_log_for_the_view(session):
    from dace import dtypes
    from dace.properties import CodeBlock
    from dace.sdfg import nodes

    from dcnb._src import actions

    def break_cpp(sdfg, where, options, device):
        if any(name.startswith("gradient_") for name in sdfg.arrays):
            return 0
        tasklet = next(n for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nodes.Tasklet))
        tasklet.code = CodeBlock("this is not C++;", dtypes.Language.CPP)
        return 1

    actions.register(actions.Action("bad_code", "writes invalid C++", False, lambda s, w, o: 1, break_cpp))
    try:
        w = SessionWidget(session)
        before = w.graphs
        _request(w, event="apply", name="bad_code")
    finally:
        del actions.REGISTRY["bad_code"]
    failed = w.steps[-1]
    assert not failed["ok"] and "does not compile" in failed["error"]
    assert "this is not C++" in failed["log"]
    assert w.graphs == before


def test_the_magic_builds_the_forward_only(ip):
    # builds [forward, None]: the build must take a missing backward (a fix in build.py)
    ip.run_cell_magic("dcoptimize", f"{FAST} --no-backward --as forward_only", MISH_CELL)
    session = ip.user_ns["forward_only"]
    assert session.backward_sdfg is None and session.current.ok
    assert set(session.current.check.errors) == {"output"}
    assert SessionWidget(session).graphs["backward"] is None
