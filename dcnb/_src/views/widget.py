"""SessionWidget: the session as a Jupyter widget. Its traits mirror the session; the browser only asks.

The view (``labextension/src/widget.ts``) draws ``graphs``, ``steps``, ``history`` and ``actions`` and sends the
messages ``EVENTS`` names: ``{event: "apply", name, where}`` (or ``match``: an index into ``matches[name]``),
``{event: "undo"}``, ``{event: "reset"}``, ``{event: "export"}``, ``{event: "show", index}`` (draw that step,
against the one it was made from; ``null``: the current one), ``{event: "profile"}``, and
``{event: "inspect", index}`` where the shown step came without its code and metrics (``inspected``) and the user
chooses an overlay or opens a node's code. Each one calls the Session and then refreshes the traits, so the Python
session is the only state. The traits and ``EVENTS`` are the protocol: ``protocol.py`` writes them out as the
view's ``protocol.ts``.

Its Cancel button interrupts the kernel: the step under way ends as cancelled and the session stays at its last
good step. The tables come formatted (``record.Table``), the steps summed up (``Step.summary``): the view shows
the text the static HTML shows.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import dace
import ipywidgets
import traitlets
from IPython.display import update_display

from .. import actions
from ..cuda_check import CudaBuild, PENDING
from ..errors import DcnbError
from ..record import tabulate_timings
from ..search import SearchResult
from ..session import Session
from ..version import VERSION
from . import graph, overlays, profile, render, sources

MODULE = "dcnb"
SIDES = ("forward", "backward")
#: nodes (forward and backward, nested included) up to which a step's code and metrics come with its pictures
INSPECT_AT_ONCE = 400
#: dcnb's output: the labextension renders the live widget where the kernel holds it, else the static text/html
SESSION_MIME = "application/vnd.dcnb.session+json"
#: the requests the view sends, ``{event: name, **arguments}``: name -> each argument and its type (an argument that
#: may be None may be left out)
EVENTS: dict[str, dict[str, Any]] = {
    "apply": {"name": str, "where": list[str] | None, "match": int | None},
    "undo": {},
    "reset": {},
    "export": {},
    "show": {"index": int | None},
    "inspect": {"index": int | None},
    "profile": {},
    "cancel_cuda": {"index": int},
    "search": {"budget": float},
}
#: the values the view draws by that the static rendering shares (``constants``; the view falls back on these,
#: generated into protocol.ts, where a saved output lacks them)
CONSTANTS: dict[str, Any] = {
    "heat_colours": list(render.HEAT_COLOURS),
    "removed_shown": render.REMOVED_SHOWN,
    "overlays": dict(render.OVERLAYS),
}


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
    graphs = traitlets.Dict(
        help="'forward' and 'backward' -> the drawable picture of each SDFG of the shown step (graph.describe), its "
        "nodes marked against the step it was made from"
    ).tag(sync=True, ts="Graphs")
    before = traitlets.Dict(
        help="the pictures of the step the shown one was made from: 'forward', 'backward' and its 'step' (empty "
        "for the naive step)"
    ).tag(sync=True, ts="BeforeData")
    shown = traitlets.Int(0, help="index of the step whose graphs are drawn (the current one unless asked)").tag(
        sync=True
    )
    inspected = traitlets.Bool(
        False,
        help="whether the shown step's code and its nodes' bytes and FLOPs came with its pictures (`sources`, the "
        "nodes' metrics): on a graph past INSPECT_AT_ONCE nodes they come when the view asks (event 'inspect')",
    ).tag(sync=True)
    steps = traitlets.List(
        help="every step tried since the last reset (Step.to_dict, plus its title, summary, compiler log and timing "
        "table)"
    ).tag(sync=True, ts="StepData[]")
    history = traitlets.Dict(
        default_value=None, allow_none=True, help="the history table, as the text and the static HTML show it (record.Table)"
    ).tag(sync=True, ts="TableData")
    current = traitlets.Int(0, help="index of the step whose SDFGs the session holds").tag(sync=True)
    actions = traitlets.List(help="the actions on offer for the selection: name, description, phase, matches").tag(
        sync=True, ts="ActionData[]"
    )
    matches = traitlets.Dict(
        help="action name -> where it applies, place by place: side, the nodes' labels and readable names, and "
        "the guids of the nodes it binds in the current picture of that side (what the view highlights)"
    ).tag(sync=True, ts="Record<string, MatchData[]>")
    selection = traitlets.List(traitlets.Unicode(), help="node labels chosen in the view; narrows `where`").tag(
        sync=True
    )
    busy = traitlets.Unicode("", help="what the session is doing now; empty when idle").tag(sync=True)
    message = traitlets.Unicode("", help="the outcome of the last request, in one sentence").tag(sync=True)
    recipe = traitlets.Unicode("[]", help="Session.recipe as JSON").tag(sync=True)
    sources = traitlets.Dict(
        help="'forward' and 'backward' -> the shown step's generated code and each node's lines in it (sources.of)"
    ).tag(sync=True, ts="Sources")
    profile = traitlets.Dict(
        help="the last profile of a step (profile.table): its 'step', the top kernels ('rows') and PyTorch eager's "
        "top ops ('eager'); empty before one"
    ).tag(sync=True, ts="ProfileData")
    search = traitlets.Dict(
        help="the last search (Session.search): its candidates' 'table' (record.Table), one 'point' per candidate "
        "that ran (its index, recipe, time relative to eager, intermediate bytes, whether it is on the time/memory "
        "front and the best) and its 'summary'; empty before one"
    ).tag(sync=True, ts="SearchData")
    constants = traitlets.Dict(
        CONSTANTS,
        help="what the view draws by, as the static rendering does: the heat colours of the overlays, low to high, "
        "and the most removed nodes the line under a graph names",
    ).tag(sync=True)

    def __init__(
        self,
        session: Session,
        *,
        variable: str = "session",
        progress: Progress | None = None,
        display_id: str | None = None,
        cluster: Any = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.session = session
        #: where the view's searches compile (Session.search's ``cluster``; None: this machine's cores)
        self.cluster = cluster
        #: the progress callable the session was built with; while a request runs it reports to ``busy``
        self.progress = progress
        self.variable = variable
        #: the display whose static rendering is refreshed after every request (kernel-free readers see it)
        self.display_id = display_id
        #: the steps' background CUDA builds whose end this view waits for
        self._watched: set[CudaBuild] = set()
        #: the step drawn, where the user asked for one other than the current
        self._shown: int | None = None
        #: action name -> its places now, as ``matches`` lists them
        self._places: dict[str, list[actions.Place]] = {}
        #: the compiled forward SDFG of the step profiled last (``profile.table`` reads what was measured of it)
        self._profiled: dace.SDFG | None = None
        self.on_msg(self._on_msg)
        self.refresh()

    # --- session -> traits ----------------------------------------------------------------------------------------

    def refresh(self) -> None:
        s = self.session
        if self._shown is not None and not self._is_good(self._shown):
            self._shown = None  # undone or reset away
        shown = s.current.index if self._shown is None else self._shown
        good = [step.index for step in s.history if step.ok and self._is_good(step.index)]
        by_sdfg = {id(s.compiled_sdfgs(index)[0]): index for index in good}
        # None: not profiled, or its step was undone or reset away
        profiled = by_sdfg.get(id(self._profiled)) if self._profiled is not None else None
        with self.hold_sync():
            self.profile = (profile.table(s, profiled) or {}) if profiled is not None else {}
            self.title = s.title
            self.shown = shown
            self.graphs, self.before = self._pictures(shown)
            self.inspected = overlays.known(s, shown) is not None
            self.sources = self._sources(shown) if self.inspected else {}
            self.steps = self._steps()
            self.current = s.current.index
            self.history = render.history(s).to_dict()
            self.recipe = json.dumps(s.recipe)
            self._refresh_actions()
        for step in s.history:
            if step.cuda is not None and step.cuda.state == PENDING and step.cuda not in self._watched:
                self._watched.add(step.cuda)
                step.cuda.on_done(self._cuda_ended)

    def _is_good(self, index: int) -> bool:
        try:
            self.session.compiled_sdfgs(index)
        except DcnbError:
            return False
        return True

    def _pictures(self, index: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The pictures of step ``index`` with what was measured of its nodes, marked against the step it was made
        from, and that step's own."""
        s = self.session
        previous = s.previous_step(index)
        diffs = graph.step_diffs(s, index)
        metrics = self._measured(index)
        graphs = {
            side: graph.describe(sdfg, before=diff, metrics=metrics.get(side))
            for side, sdfg, diff in zip(SIDES, s.compiled_sdfgs(index), diffs)
        }
        if previous is None:
            return graphs, {}
        old = s.compiled_sdfgs(previous)
        before = {side: graph.describe(was, after=diff) for side, was, diff in zip(SIDES, old, diffs)}
        return graphs, {**before, "step": previous}

    def _measured(self, index: int) -> dict[str, dict[str, dict]]:
        """Side -> node guid -> bytes, FLOPs and intensity of step ``index``'s nodes, with the milliseconds where
        it was profiled; the static numbers only for a step inspected (small graphs always are)."""
        if self._small(index):
            overlays.of(self.session, index)
        return overlays.measured(self.session, index)

    def _sources(self, index: int) -> dict[str, Any]:
        """Step ``index``'s generated code, or none where its build folder is gone (a cache cleared meanwhile)."""
        try:
            return sources.of(self.session, index)
        except DcnbError:
            return {}

    def _small(self, index: int) -> bool:
        """Whether step ``index``'s code and metrics come with its pictures (they take seconds to work out on a
        large graph: there the view asks for them, ``{event: "inspect"}``)."""
        forward, backward = self.session.compiled_sdfgs(index)
        nodes = sum(len(list(s.all_nodes_recursive())) for s in (forward, backward) if s is not None)
        return nodes <= INSPECT_AT_ONCE

    def _steps(self) -> list[dict[str, Any]]:
        return [
            dict(
                step.to_dict(),
                title=step.title,
                summary=step.summary,
                log=step.log,
                timing=tabulate_timings(step.timings).to_dict(),
            )
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
        offers = self.session.actions(where=self.selection or None)
        self.actions = [
            {
                "name": a.name,
                "description": a.description,
                "before_autodiff": a.before_autodiff,
                "phase": a.phase,
                "matches": a.matches,
            }
            for a in offers
        ]
        names, by_guid = self._names()
        self._places = {a.name: list(a.at) for a in offers if a.at}
        self.matches = {
            name: [
                {
                    "side": place.side,
                    "labels": list(place.labels),
                    # by its nodes where the picture has them: nodes of one label may be of different ops
                    "names": list(dict.fromkeys(by_guid[g] for g in place.guids if g in by_guid))
                    or [names.get(x, x) for x in place.labels],
                    "guids": list(place.guids),
                }
                for place in at
            ]
            for name, at in self._places.items()
        }

    def _names(self) -> tuple[dict[str, str], dict[str, str]]:
        """The readable names the current pictures draw: by node label (its first node's), and by node guid."""
        by_label: dict[str, str] = {}
        by_guid: dict[str, str] = {}
        for picture in self.graphs.values():
            for node in graph.all_nodes(picture) if picture is not None else ():
                by_label.setdefault(node["label"], node.get("name", node["label"]))
                by_guid[node["guid"]] = node.get("name", node["label"])
        return by_label, by_guid

    # --- requests from the view -----------------------------------------------------------------------------------

    def _on_msg(self, widget: SessionWidget, content: dict, buffers: list) -> None:
        event = content.get("event")
        if event in EVENTS and not self.busy:
            self._run(self._handlers(content)[event])

    def _handlers(self, content: dict) -> dict[str, Callable[[], str | None]]:
        """Each of EVENTS' requests, with the arguments ``content`` holds."""
        return {
            "apply": lambda: self.apply(
                str(content.get("name", "")), content.get("where") or None, content.get("match")
            ),
            "undo": self.undo,
            "reset": self.reset,
            "export": self.export_recipe,
            "show": lambda: self.show(content.get("index")),
            "inspect": lambda: self.inspect(content.get("index")),
            "profile": self.run_profile,
            "cancel_cuda": lambda: self.cancel_cuda(content.get("index")),
            "search": lambda: self.run_search(content.get("budget")),
        }

    def _run(self, request: Callable[[], str | None]) -> None:
        """Run a request; its outcome (None: nothing to tell, the last one stays) in ``message``."""
        if self.progress is not None:
            self.progress.listener = self._progress
        try:
            outcome = request()
            if outcome is not None:
                self.message = outcome
        except (DcnbError, KeyError, OSError) as e:
            self.message = str(e).strip("'\"")
        except KeyboardInterrupt:  # the view's Cancel (it interrupts the kernel), or the kernel's stop button
            cancelled = self.session.history[-1]
            reason = cancelled.error if not cancelled.ok else "cancelled"
            self.message = f"{reason}; the session stays at step {self.session.current.index}"
        finally:
            if self.progress is not None:
                self.progress.listener = None
            # the view hears the request's end with what it changed, at once: a view no longer busy shows them
            with self.hold_sync():
                try:
                    self.refresh()
                finally:
                    self.busy = ""
        self.update_static()

    def apply(self, name: str, where: list[str] | None = None, match: int | None = None) -> str:
        """Apply an action as the view asks, where the selection is or at one of its ``matches``; returns the
        outcome in one sentence."""
        if match is not None:
            places = self._places.get(name, [])
            if not isinstance(match, int) or not 0 <= match < len(places):
                raise DcnbError(f"{name} has no match {match!r} now (it matches {len(places)} place(s))")
            where = list(places[match].labels)
        self.busy = f"applying {name}"
        step = self.session.apply(name, where=where)
        if step.ok:
            return f"{step.headline} applied at {step.applied} place(s)"
        return step.summary

    def inspect(self, index: int | None = None) -> None:
        """Work out the generated code of step ``index`` (None: the shown one) and its nodes' bytes, FLOPs and
        intensity. On a graph past INSPECT_AT_ONCE nodes the view asks as the user chooses an overlay or opens a
        node's code: the outcome of the user's last request stays in ``message``."""
        index = self.shown if index is None else index
        if not isinstance(index, int) or not self._is_good(index):
            raise DcnbError(f"step {index} cannot be inspected: only the good steps that led to the current one can")
        self.busy = "reading the generated code and counting bytes and FLOPs"
        overlays.of(self.session, index)

    def run_profile(self) -> str:
        """Time each map and library node of the current step in an instrumented build of its own, beside PyTorch
        eager's profile; the step's own timing stays as it was measured."""
        self.busy = "profiling: an instrumented build, timed"
        index = self.session.current.index
        profile.run(self.session)
        # the table (its kernels by the names the graphs draw) and the pictures come with the refresh after this
        self._profiled = self.session.forward_sdfg
        self._shown = None
        measured = profile.table(self.session)
        top = measured["rows"][0] if measured["rows"] else None
        where = f"; the slowest: {top['name']} ({top['ms']:.3g} ms, {top['share']:.0%})" if top else ""
        return f"step {index} profiled: {measured['step_ms']:.3g} ms per call instrumented{where}"

    def show(self, index: int | None) -> str:
        """Draw step ``index`` (None: the current one) against the step it was made from."""
        if index is None or index == self.session.current.index:
            self._shown = None
            return f"showing the current step {self.session.current.index}"
        if not isinstance(index, int) or not self._is_good(index):
            raise DcnbError(f"step {index} cannot be shown: only the good steps that led to the current one can")
        self._shown = index
        return f"showing step {index}, against the step it was made from"

    def undo(self) -> str:
        return f"back at step {self.session.undo().index}"

    def reset(self) -> str:
        self.selection = []
        self._shown = None
        self.session.reset()
        return "back at the naive step"

    def run_search(self, budget: float | None) -> str:
        """Search for a recipe from the current step within ``budget`` seconds (Session.search); the best becomes
        steps, every candidate shows in ``search``."""
        if not isinstance(budget, (int, float)) or isinstance(budget, bool):
            raise DcnbError(f"a search needs a budget in seconds (got {budget!r})")
        self.busy = f"searching for {budget:g} s"
        found = self.session.search(float(budget), cluster=self.cluster)
        self.record_search(found)
        return f"{found.headline}; {found.summary()}"

    def record_search(self, found: SearchResult) -> None:
        """Show a search's candidates (their table and plot) and the best against the start."""
        self.search = {"table": found.table().to_dict(), "points": found.points(), "summary": found.summary()}

    def cancel_cuda(self, index: int | None) -> str:
        """Stop the background CUDA build of step ``index`` (running or queued) with its compilers."""
        step = next((s for s in self.session.history if s.index == index), None)
        if step is None or step.cuda is None or step.cuda.state != PENDING:
            raise DcnbError(f"step {index} has no CUDA build under way to cancel")
        step.cuda.cancel()
        step.cuda.wait(2)
        return f"step {index}: {step.cuda.text}"

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
        bundle[SESSION_MIME] = {
            "model_id": self.model_id,
            "version": VERSION,
            "graphs": self.graphs,
            "constants": self.constants,
        }
        return bundle
