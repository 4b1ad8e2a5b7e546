"""Every notebook in notebooks/ runs top to bottom in a real kernel, at the small scale, through `dcnb run`'s
machinery: a cell that raises, or one of the notebook's own assertions that fails, fails the suite. Its HTML
report is then opened in headless Chromium, as a reader would, and kept as screenshots in test-artifacts/."""

import pathlib

import nbformat
import pytest

from dcnb._src import report

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

pytestmark = [pytest.mark.kernel, pytest.mark.compile]
#: the notebooks make test runs: the tutorial (make mish's) and the search; the others with make notebooks
DEFAULT = {"mish", "search"}


def test_the_notebooks_are_there():
    names = {p.stem for p in NOTEBOOKS}
    assert {"mish", "softmax_layernorm", "transformer_layer", "teaching_data_movement", "models", "search"} <= names


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, id=p.stem, marks=() if p.stem in DEFAULT else pytest.mark.notebooks) for p in NOTEBOOKS],
)
def test_the_notebook_runs_and_its_checks_hold(path, tmp_path, browser, artifacts):
    result = report.run(path, tmp_path, scale="small", timeout=900)
    assert result.ok, result.error
    executed = nbformat.read(result.notebook, as_version=4)
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code)
    # each notebook ends by asserting its own claims
    assert "assert " in code[-1].source and "all checks hold" in report._text(code[-1])
    # the report a reader opens shows the graphs and the tables without a kernel
    html = result.html.read_text()
    assert html.count("data:image/svg+xml;base64,") >= 2 and "dcnb-history" in html
    # as a reader opens it, offline: every picture draws, and no formula is left as TeX source (MathJax would
    # come from the network)
    page = browser.new_page()
    try:
        page.goto(result.html.as_uri())
        assert page.locator("img").count() >= 2
        assert page.evaluate("[...document.images].every(i => i.complete && i.naturalWidth > 0)")
        assert not [t for t in page.locator(".jp-RenderedMarkdown").all_inner_texts() if "$" in t]
        page.screenshot(path=str(artifacts / f"notebook-{path.stem}-top.png"))
        page.locator(".jp-Cell").last.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts / f"notebook-{path.stem}-end.png"))
    finally:
        page.close()
