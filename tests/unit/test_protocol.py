"""The widget's protocol: the view's protocol.ts is what the traits and EVENTS write, and each event is answered.

The messages go through the widget's comm handler as the browser's would, with no kernel (ipywidgets' comm-less
widgets); the view's side (it sends inspect for a large graph) is tested in labextension/src/__tests__."""

import pathlib
import re

import pytest

from dcnb._src.errors import DcnbError
from dcnb._src.record import Step
from dcnb._src.views import overlays, protocol, render, sources, widget

ROOT = pathlib.Path(__file__).resolve().parents[2]


class _Session:
    """The little of a Session the widget reads: two good steps, no SDFGs (nothing to compile)."""

    name, title, device, recipe, forward_sdfg, backward_sdfg = "Mish", "Mish (4x8) on cpu", "cpu", [], None, None

    def __init__(self):
        self.history = [Step(0, "naive", {}, None, ok=True), Step(1, "map_fusion", {}, None, ok=True)]
        self.current = self.history[-1]

    def as_text(self) -> str:
        return f"dcnb session: {self.title}"

    def actions(self, where: list[str] | None = None) -> list:
        return []

    def compiled_sdfgs(self, index: int | None = None) -> tuple[None, None]:
        if index not in (None, 0, 1):
            raise DcnbError(f"step {index} is not a good step of this session")
        return None, None

    def previous_step(self, index: int | None = None) -> int | None:
        return None


def _request(w: widget.SessionWidget, **content) -> None:
    """Deliver a message as the browser's view sends it, through the comm's handler."""
    w._handle_msg({"content": {"data": {"method": "custom", "content": content}}, "buffers": []})


@pytest.fixture
def worked_out(monkeypatch) -> set[int]:
    """The steps whose code and metrics were worked out: none until asked, as on a graph past INSPECT_AT_ONCE."""
    done: set[int] = set()
    monkeypatch.setattr(widget, "INSPECT_AT_ONCE", -1)
    monkeypatch.setattr(overlays, "of", lambda session, index=None: done.add(index) or {})
    monkeypatch.setattr(overlays, "known", lambda session, index=None: {} if index in done else None)
    monkeypatch.setattr(overlays, "measured", lambda session, index=None: {"forward": {}, "backward": {}})
    monkeypatch.setattr(sources, "of", lambda session, index=None: {"forward": None, "backward": None})
    return done


def test_protocol_ts_is_what_the_traits_write():
    written = (ROOT / "labextension" / "src" / "protocol.ts").read_text()
    assert written == protocol.typescript(), "run: .venv/bin/python -m dcnb._src.views.protocol"
    # every synced trait of the widget's own, each event, and the constants the view draws by
    declared = re.search(r"export interface SessionState \{(.*?)\n\}", written, re.DOTALL)[1]
    assert re.findall(r"^  (\w+):", declared, re.MULTILINE) == list(protocol.traits())
    assert {"graphs", "inspected", "steps", "constants"} <= set(protocol.traits())
    events = re.search(r"export const EVENTS = \[(.*)\] as const;", written)[1]
    assert re.findall(r"'(\w+)'", events) == list(widget.EVENTS)
    assert "removed_shown: 12" in written and "'#bd0026'" in written


def test_each_event_is_answered(worked_out, monkeypatch):
    w = widget.SessionWidget(_Session())
    assert set(w._handlers({})) == set(widget.EVENTS)
    called = []
    for method in ("apply", "undo", "reset", "export_recipe", "show", "inspect", "run_profile", "cancel_cuda",
                   "run_search"):
        monkeypatch.setattr(w, method, lambda *args, _m=method: called.append((_m, *args)) or f"did {_m}")
    arguments = {"apply": {"name": "map_fusion", "where": ["x"], "match": None}, "show": {"index": 0},
                 "inspect": {"index": 1}, "cancel_cuda": {"index": 1}, "search": {"budget": 30}}
    for event in widget.EVENTS:
        _request(w, event=event, **arguments.get(event, {}))
    assert called == [("apply", "map_fusion", ["x"], None), ("undo",), ("reset",), ("export_recipe",), ("show", 0),
                      ("inspect", 1), ("run_profile",), ("cancel_cuda", 1), ("run_search", 30)]
    assert w.message == "did run_search" and w.busy == ""
    _request(w, event="no such event")
    assert len(called) == len(widget.EVENTS)


def test_a_graph_without_its_code_and_metrics_gets_them_when_the_view_asks(worked_out):
    w = widget.SessionWidget(_Session())
    assert w.shown == 1 and not w.inspected and w.sources == {}
    w.message = "step 1: map_fusion applied at 2 place(s)"
    _request(w, event="inspect", index=1)
    assert worked_out == {1} and w.inspected and w.sources == {"forward": None, "backward": None}
    # asked by the view, not the user: the outcome of the user's last request stays
    assert w.message == "step 1: map_fusion applied at 2 place(s)" and w.busy == ""
    _request(w, event="inspect", index=7)
    assert worked_out == {1} and w.message.startswith("step 7 cannot be inspected")


def test_the_view_draws_by_the_static_renderings_constants(worked_out):
    w = widget.SessionWidget(_Session())
    assert w.constants == {
        "heat_colours": list(render.HEAT_COLOURS),
        "removed_shown": render.REMOVED_SHOWN,
        "overlays": render.OVERLAYS,
    }
    # and so does the drawing of a saved output without the kernel
    assert w._repr_mimebundle_()[widget.SESSION_MIME]["constants"] == w.constants
