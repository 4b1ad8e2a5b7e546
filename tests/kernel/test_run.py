"""`dcnb run`: a notebook through a fresh kernel, the executed notebook and the HTML left behind, the report
cells printed, a failing cell named with its error and a non-zero exit."""

import json
import os
import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

pytestmark = pytest.mark.kernel


def _notebook(path, *cells):
    nb = new_notebook(cells=list(cells))
    nbformat.write(nb, path)
    return path


def _dcnb(*args, cwd, env=None):
    return subprocess.run(
        [sys.executable, "-m", "dcnb._src.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300, env=env
    )


def test_run_leaves_the_executed_notebook_and_html_and_prints_the_report(tmp_path):
    report = new_code_cell("import os\nprint('scale', os.environ['DCNB_NOTEBOOK_SCALE'], 'in', here)\n6 * 7")
    report.metadata["tags"] = ["report"]
    path = _notebook(
        tmp_path / "tiny.ipynb",
        new_markdown_cell("# Tiny <b>report</b>"),
        new_code_cell("%load_ext dcnb\nimport pathlib\nhere = pathlib.Path.cwd().name"),
        report,
        new_code_cell("print('not ' + 'in the report')"),
    )
    done = _dcnb("run", str(path), "--out", "result", "--scale", "small", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "scale small in result\n42" in done.stdout and "not in the report" not in done.stdout
    assert "[ 1/3] %load_ext dcnb" in done.stdout
    # the kernel process's own messages (its transport warning) go to a log, not between the progress lines
    assert "[IPKernelApp]" not in done.stdout + done.stderr and (tmp_path / "result" / "tiny.kernel.log").exists()
    executed = nbformat.read(tmp_path / "result" / "tiny.ipynb", as_version=4)
    # the kernel ran in the output folder, and loading dcnb showed nothing (DaCe's viewer script stays out)
    assert executed.cells[1].outputs == []
    assert "widgets" not in executed.metadata
    html = (tmp_path / "result" / "tiny.html").read_text()
    assert "Tiny" in html and "not in the report" in html
    assert (tmp_path / "tiny.ipynb").read_text() == path.read_text()  # the source notebook is left as it was


def test_run_names_the_failing_cell_and_still_writes_the_report(tmp_path):
    path = _notebook(
        tmp_path / "broken.ipynb",
        new_code_cell("x = 1"),
        new_code_cell("assert x == 2, 'x is not two'"),
        new_code_cell("print('never runs')"),
    )
    done = _dcnb("run", str(path), cwd=tmp_path)
    assert done.returncode == 1
    assert "assert x == 2" in done.stderr and "AssertionError: x is not two" in done.stderr
    assert "\x1b[" not in done.stderr
    executed = json.loads((tmp_path / "out" / "broken.ipynb").read_text())
    assert executed["cells"][1]["outputs"][0]["ename"] == "AssertionError"
    assert executed["cells"][2]["outputs"] == []
    assert (tmp_path / "out" / "broken.html").exists()


def test_run_without_a_notebook_says_so(tmp_path):
    done = _dcnb("run", "missing.ipynb", cwd=tmp_path)
    assert done.returncode == 2 and "no notebook at missing.ipynb" in done.stderr


@pytest.mark.cuda
def test_run_builds_for_cuda_in_the_background_only_when_asked(tmp_path):
    cell = new_code_cell("import os\nprint('cuda build', os.environ.get('DCNB_CUDA_BUILD'))")
    cell.metadata["tags"] = ["report"]
    path = _notebook(tmp_path / "env.ipynb", cell)
    env = {k: v for k, v in os.environ.items() if k != "DCNB_CUDA_BUILD"}  # (the suite sets it: tests/conftest.py)
    for flags, value in (((), "0"), (("--cuda-build",), "1")):
        done = _dcnb("run", str(path), *flags, cwd=tmp_path, env=env)
        assert done.returncode == 0 and f"cuda build {value}" in done.stdout, done.stderr
