"""SessionWidget: the session as a Jupyter widget. Its traits mirror the session; the browser only asks.

The view (``labextension/src/widget.ts``) draws ``graphs``, ``steps``, ``history`` and ``actions`` and sends
messages: ``{event: "apply", name, where}``, ``{event: "undo"}``, ``{event: "reset"}``, ``{event: "export"}``. Each
one calls the Session and then refreshes the traits, so the Python session is the only state. The tables come
formatted (``record.Table``): the view draws their cells as the text and the static HTML show them.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import ipywidgets
import traitlets
from IPython.display import update_display

from . import graph, render
from .cuda_check import PENDING, CudaBuild
from .errors import DcnbError
from .record import tabulate_history, tabulate_timings
from .session import Session
from .version import VERSION

MODULE = "dcnb"
#: dcnb's output: the labextension renders the live widget where the kernel holds it, else the static text/html
SESSION_MIME = "application/vnd.dcnb.session+json"


class Progress:
    """A progress callable for Session that forwards each message to whoever listens now (or drops it)."""

    def __init__(self, listener: Callable[[str], None] | None = None):
        self.listener = listener

    def __call__(self, message: str) -> None:
        if self.listener is not None:
            self.listener(message)


class SessionWidget(ipywidgets.DOMWidget):
    """An interactive view of a Session: its graphs, the actions on offer, and every step's results."""

    _model_name = traitlets.Unicode("SessionModel").tag(sync=True)
    _view_name = traitlets.Unicode("SessionView").tag(sync=True)
    _model_module = traitlets.Unicode(MODULE).tag(sync=True)
    _view_module = traitlets.Unicode(MODULE).tag(sync=True)
    _model_module_version = traitlets.Unicode(VERSION).tag(sync=True)
    _view_module_version = traitlets.Unicode(VERSION).tag(sync=True)

    title = traitlets.Unicode(help="the module, its input shapes and the device").tag(sync=True)
    variable = traitlets.Unicode(help="the name the session is bound to in the notebook").tag(sync=True)
    graphs = traitlets.Dict(help="'forward' and 'backward' -> the drawable picture of each SDFG (graph.describe)").tag(
        sync=True
    )
    steps = traitlets.List(
        help="every step tried since the last reset (Step.to_dict, plus its title, compiler log and timing table)"
    ).tag(sync=True)
    history = traitlets.Dict(help="the history table, as the text and the static HTML show it (record.Table)").tag(
        sync=True
    )
    current = traitlets.Int(0, help="index of the step whose SDFGs the session holds").tag(sync=True)
    actions = traitlets.List(help="the actions on offer for the selection: name, description, phase, matches").tag(
        sync=True
    )
    selection = traitlets.List(traitlets.Unicode(), help="node labels chosen in the view; narrows `where`").tag(
        sync=True
    )
    busy = traitlets.Unicode("", help="what the session is doing now; empty when idle").tag(sync=True)
    message = traitlets.Unicode("", help="the outcome of the last request, in one sentence").tag(sync=True)
    recipe = traitlets.Unicode("[]", help="Session.recipe as JSON").tag(sync=True)

    def __init__(
        self,
        session: Session,
        *,
        variable: str = "session",
        progress: Progress | None = None,
        display_id: str | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.session = session
        #: the progress callable the session was built with; while a request runs it reports to ``busy``
        self.progress = progress
        self.variable = variable
        #: the display whose static rendering is refreshed after every request (kernel-free readers see it)
        self.display_id = display_id
        #: the steps' background CUDA builds whose end this view waits for
        self._watched: set[CudaBuild] = set()
        self.on_msg(self._on_msg)
        self.refresh()

    # --- session -> traits ----------------------------------------------------------------------------------------

    def refresh(self) -> None:
        s = self.session
        with self.hold_sync():
            self.title = s.as_text().splitlines()[0].removeprefix("dcnb session: ")
            self.graphs = {"forward": graph.describe(s.forward_sdfg), "backward": graph.describe(s.backward_sdfg)}
            self.steps = self._steps()
            self.current = s.current.index
            self.history = tabulate_history(s.history, s.current.index).to_dict()
            self.recipe = json.dumps(s.recipe)
            self._refresh_actions()
        for step in s.history:
            if step.cuda is not None and step.cuda.state == PENDING and step.cuda not in self._watched:
                self._watched.add(step.cuda)
                step.cuda.on_done(self._cuda_ended)

    def _steps(self) -> list[dict[str, Any]]:
        return [
            dict(step.to_dict(), title=step.title, log=step.log, timing=tabulate_timings(step.timings).to_dict())
            for step in self.session.history
        ]

    def _cuda_ended(self, build: CudaBuild) -> None:
        """On the thread that waited for the build (ipywidgets sends traits from any thread): its outcome shows in
        the view and in the rendering a saved notebook keeps, without a request to refresh them."""
        self._watched.discard(build)
        self.steps = self._steps()
        self.update_static()

    @traitlets.observe("selection")
    def _selection_changed(self, change: dict) -> None:
        self._refresh_actions()

    def _refresh_actions(self) -> None:
        where = self.selection or None
        self.actions = [
            {
                "name": a.name,
                "description": a.description,
                "before_autodiff": a.before_autodiff,
                "phase": a.phase,
                "matches": a.matches,
            }
            for a in self.session.actions(where=where)
        ]

    # --- requests from the view -----------------------------------------------------------------------------------

    def _on_msg(self, widget: SessionWidget, content: dict, buffers: list) -> None:
        event = content.get("event")
        handlers: dict[str, Callable[[], str]] = {
            "apply": lambda: self.apply(str(content.get("name", "")), content.get("where") or None),
            "undo": self.undo,
            "reset": self.reset,
            "export": self.export_recipe,
        }
        if event in handlers and not self.busy:
            self._run(handlers[event])

    def _run(self, request: Callable[[], str]) -> None:
        if self.progress is not None:
            self.progress.listener = self._progress
        try:
            self.message = request()
        except (DcnbError, KeyError, OSError) as e:
            self.message = str(e).strip("'\"")
        finally:
            self.busy = ""
            if self.progress is not None:
                self.progress.listener = None
        self.refresh()
        self.update_static()

    def apply(self, name: str, where: list[str] | None = None) -> str:
        """Apply an action as the view asks; returns the outcome in one sentence."""
        self.busy = f"applying {name}"
        step = self.session.apply(name, where=where)
        if step.ok:
            return f"step {step.index}: {step.title} applied at {step.applied} place(s)"
        return f"step {step.index}: {step.title} failed: {step.error}"

    def undo(self) -> str:
        return f"back at step {self.session.undo().index}"

    def reset(self) -> str:
        self.selection = []
        self.session.reset()
        return "back at the naive step"

    def export_recipe(self, path: str | None = None) -> str:
        """Write the recipe next to the notebook, for ``%%dcoptimize --recipe``."""
        target = pathlib.Path(path or f"{self.variable}.recipe.json")
        target.write_text(json.dumps(self.session.recipe, indent=2) + "\n")
        return f"wrote {target}: add --recipe {target} to the %%dcoptimize line to replay these steps"

    def _progress(self, message: str) -> None:
        self.busy = message

    # --- display --------------------------------------------------------------------------------------------------

    def update_static(self) -> None:
        """Refresh the display's static rendering, so that a notebook saved now shows the current state."""
        if self.display_id is not None:
            update_display(self._repr_mimebundle_(), display_id=self.display_id, raw=True)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The widget (for front ends without dcnb's extension), dcnb's own output, and the static rendering
        (for readers without the kernel: JupyterLab, nbconvert, GitHub)."""
        bundle = super()._repr_mimebundle_(**kwargs) or {}
        bundle["text/plain"] = self.session.as_text()
        bundle["text/html"] = render.to_html(self.session)
        # the pictures too: without the kernel, dcnb's extension draws them (pan, zoom, details) in place of the SVGs
        bundle[SESSION_MIME] = {"model_id": self.model_id, "version": VERSION, "graphs": self.graphs}
        return bundle
