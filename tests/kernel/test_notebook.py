"""%%dcoptimize in a real Jupyter kernel (nbclient): the outputs a saved notebook keeps."""

import json
import os

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

pytestmark = [pytest.mark.kernel, pytest.mark.compile]

SETUP = "%load_ext dcnb\nimport torch\nfrom torch import nn\nimport torch.nn.functional as F"
MISH = """%%dcoptimize --inputs torch.rand(2,4,8,8) --baselines torch --time-budget 0.05 {extra}
class Mish(nn.Module):
    def forward(self, x):
        return x * torch.tanh(F.softplus(x))"""


def execute(cells: list[str], tmp_path, allow_errors=False) -> nbformat.NotebookNode:
    nb = new_notebook(cells=[new_code_cell(c) for c in cells])
    client = NotebookClient(
        nb, timeout=300, kernel_name="python3", allow_errors=allow_errors, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute(env=dict(os.environ))
    return nb


def test_the_magic_in_a_kernel_leaves_a_widget_and_a_static_rendering(tmp_path):
    nb = execute(
        [
            SETUP,
            MISH.format(extra=""),
            "assert mish_opt.current.ok\nimport json\nopen('r.json', 'w').write(json.dumps([{'name': 'tasklet_fusion'}]))",
            MISH.format(extra="--recipe r.json --as again"),
            "print([s.name for s in again.history], again.current.intermediate_bytes)",
        ],
        tmp_path,
    )
    outputs = nb.cells[1].outputs
    views = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(views) == 1
    data = views[0]["data"]
    assert data["text/html"].count("data:image/svg+xml;base64,") == 2
    assert "dcnb-history" in data["text/html"] and "torch eager" in data["text/html"]
    assert data["text/plain"].startswith("dcnb session: Mish (2x4x8x8) on cpu")
    # the progress line is emptied once the session is built
    progress = [o for o in outputs if o.get("data", {}).get("text/plain", None) == ""]
    assert progress, outputs
    assert nb.cells[4].outputs[0]["text"].strip() == "['naive', 'tasklet_fusion'] 0"
    assert "tasklet_fusion" in nb.cells[3].outputs[-1]["data"]["text/html"]


def test_bad_input_in_a_kernel_is_one_paragraph_and_fails_the_cell(tmp_path):
    nb = execute(
        [SETUP, "%%dcoptimize --inputs torch.rand(2)\nkept = 42", "print(kept)"], tmp_path, allow_errors=True
    )
    cell = nb.cells[1]
    text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    assert text.startswith("UsageError: The cell defines no torch.nn.Module subclass")
    assert "Traceback" not in json.dumps(cell.outputs)
    assert nb.cells[2].outputs[0]["text"] == "42\n"
