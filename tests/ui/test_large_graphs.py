"""The session view on a graph of the size users bring, in a real JupyterLab: a ResNet-18's layout (transformers'
ResNet, four stages of two basic blocks, at tiny widths), 620 nodes forward and 1,416 backward, past the
kernel's INSPECT_AT_ONCE. Its code and metrics come when the user asks (a node's code, an overlay), the view says
why they are not there yet, and then shows them; the time overlay says it needs a profile."""

import re

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from playwright.sync_api import expect

from conftest import TOKEN, run_all

pytestmark = [pytest.mark.ui, pytest.mark.compile, pytest.mark.models]

CELLS = [
    "%load_ext dcnb\nimport torch, dcnb\nfrom transformers import ResNetConfig, ResNetForImageClassification\n"
    "from dcnb._src.views.widget import SessionWidget",
    "torch.manual_seed(0)\n"
    "config = ResNetConfig(embedding_size=8, hidden_sizes=[8, 8, 16, 16], depths=[2, 2, 2, 2], layer_type='basic',"
    " num_labels=4)\n"
    "r = dcnb.optimize(ResNetForImageClassification(config), torch.randn(2, 3, 32, 32), baselines=(), "
    "time_budget=0.0)\n"
    "SessionWidget(r, variable='r')",
]


def test_code_and_overlays_of_a_resnet18_backward_come_when_asked(lab, page, artifacts):
    base, folder = lab
    kernel = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(new_notebook(cells=[new_code_cell(c) for c in CELLS], metadata={"kernelspec": kernel}),
                   folder / "resnet18.ipynb")
    page.goto(f"{base}/lab/tree/resnet18.ipynb?token={TOKEN}")
    run_all(page, "resnet18.ipynb")
    view = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .dcnb-session:not(.dcnb-kernel-free)").first
    view.locator(".dcnb-node").first.wait_for(timeout=600_000)
    view.scroll_into_view_if_needed()
    view.locator("button[data-tab=backward]").click()
    expect(view.locator(".dcnb-notice")).to_be_hidden(timeout=60_000)

    # a node's code: the panel says why it is not there yet, then shows the node's lines
    view.get_by_role("button", name="Expand all").click()
    expect(view.locator(".dcnb-notice")).to_be_hidden(timeout=60_000)
    tasklet = view.locator("g.dcnb-node.dcnb-tasklet").first
    tasklet.dispatch_event("click")
    title = view.locator(".dcnb-code-title")
    expect(view.locator(".dcnb-code-text")).to_contain_text("worked out when asked", timeout=10_000)
    view.screenshot(path=str(artifacts / "ui-resnet18-code-asked.png"))
    expect(title).to_contain_text("lines ", timeout=300_000)
    assert view.locator(".dcnb-code-text").inner_text().strip()
    view.screenshot(path=str(artifacts / "ui-resnet18-code.png"))

    # the overlays: bytes colours the backward's nodes with a legend; time says it needs a profile
    select = view.locator(".dcnb-overlay select")
    select.select_option("bytes")
    expect(view.locator("g.dcnb-node.dcnb-heat").first).to_be_attached(timeout=60_000)
    expect(view.locator(".dcnb-legend")).to_contain_text(re.compile(r"bytes \(log scale\)"))
    view.get_by_role("button", name="Fit").click()
    view.screenshot(path=str(artifacts / "ui-resnet18-bytes.png"))
    select.select_option("ms")
    expect(view.locator(".dcnb-legend")).to_contain_text("Profile times each kernel")
    view.screenshot(path=str(artifacts / "ui-resnet18-time-missing.png"))
