"""After `%load_ext dcnb`, dcnb's objects display as a reader wants them: a Session as its widget (with the static
rendering), a Step as its report and timing table, an SDFG as dcnb's picture; each keeps its text form."""

import html
import re

import pytest
import torch

import dcnb
from tests.models import Mish

pytestmark = pytest.mark.compile


@pytest.fixture(scope="module")
def session():
    torch.manual_seed(0)
    return dcnb.optimize(Mish(), torch.rand(2, 4, 8, 8), baselines=("torch",), time_budget=0.05)


def test_a_session_shows_its_widget_and_static_rendering(ip, session):
    ip.user_ns["shown_opt"] = session
    data, _ = ip.display_formatter.format(session)
    assert data["text/plain"].startswith("dcnb session: Mish (2x4x8x8) on cpu")
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["text/html"].count("data:image/svg+xml;base64,") == 2 and "dcnb-history" in data["text/html"]


def _html(ip, obj) -> str:
    # the printer a notebook front end gets (this test shell is a terminal, whose HTML formatter is off)
    return ip.display_formatter.formatters["text/html"].lookup(obj)(obj)


def test_a_step_shows_its_report_and_table(ip, session):
    assert ip.display_formatter.format(session.current)[0]["text/plain"] == session.current.as_text()
    html = _html(ip, session.current)
    assert "<b>step 0: naive</b>" in html and "dcnb-timing" in html


def test_an_sdfg_shows_as_a_picture_not_daces_script(ip, session):
    html = _html(ip, session.backward_sdfg)
    assert "<script" not in html and html.count("data:image/svg+xml;base64,") == 1
    assert session.backward_sdfg.name in html


def test_the_text_the_html_and_the_widget_show_one_history_table(ip, session):
    from dcnb._src.views.widget import SessionWidget

    ip.user_ns["shown_opt"] = session
    data, _ = ip.display_formatter.format(session)
    table = SessionWidget(session).history
    rows = [table["columns"], *(r["cells"] for r in table["rows"])]
    text = [line for line in data["text/plain"].splitlines()[1:] if not line.startswith("|-")]
    assert [[c.strip() for c in line.strip("|").split("|")] for line in text] == rows
    history = re.search(r"<table class='dcnb-table dcnb-history'.*?</table>", data["text/html"]).group(0)
    cells = [re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", tr) for tr in re.findall(r"<tr.*?</tr>", history)]
    assert [[html.unescape(c) for c in row] for row in cells] == rows
    assert "torch.compile ms" in rows[0]
