"""How dcnb's objects display in IPython once ``%load_ext dcnb`` ran: a Session as its widget, a Step as its
report and table, an SDFG as the picture dcnb draws (DaCe's own viewer needs a script from the network).

Each keeps its text/plain form for terminals; the HTML forms are static, so saved notebooks show them without a
kernel.
"""

from __future__ import annotations

import html
from typing import Any

import dace

from ..record import Step
from ..session import Session
from . import graph, render


def register(ipython: Any) -> None:
    formatter = ipython.display_formatter
    formatter.mimebundle_formatter.for_type(Session, lambda s, include=None, exclude=None: _session(s, ipython))
    formatter.formatters["text/html"].for_type(Step, render.step_html)
    formatter.formatters["text/html"].for_type(dace.SDFG, sdfg_html)


def sdfg_html(sdfg: dace.SDFG) -> str:
    picture = graph.describe(sdfg)
    return (
        "<div class='dcnb-static dcnb-sdfg' style='font-family: sans-serif; font-size: 13px'>"
        f"<h5 style='margin: 4px 0'>SDFG {html.escape(sdfg.name)} ({graph.size(picture)} nodes)</h5>"
        f"{render.graph_img(picture)}</div>"
    )


def _session(session: Session, ipython: Any) -> dict[str, Any]:
    from .widget import SessionWidget  # ipywidgets is loaded only when a session is shown

    names = [k for k, v in ipython.user_ns.items() if v is session and not k.startswith("_")]
    return SessionWidget(session, variable=names[0] if names else "session")._repr_mimebundle_()
