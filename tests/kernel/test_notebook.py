"""%%dcoptimize in a real Jupyter kernel: the outputs a saved notebook keeps (nbclient), and the progress line as a
front end sees it come (jupyter_client)."""

import json
import os
import queue
import re
import time

import nbformat
import pytest
from jupyter_client.manager import KernelManager
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


# slow to export (the trace sleeps): a phase long enough to tick through, at no cost to the shared cores
SLOW_EXPORT = """%%dcoptimize --inputs torch.rand(2,4,8,8) --baselines '' --time-budget 0.05 {extra}
import time
class Mish(nn.Module):
    def forward(self, x):
        if torch.jit.is_tracing():
            time.sleep(3.5)
        return x * torch.tanh(F.softplus(x))"""
LINE = re.compile(r"dcnb: Mish: (?P<phase>.+) \((?:(?P<this>\d+) s in this phase, )?(?P<all>\d+) s in all\)")
TICKER = "dcnb progress line"


class _Kernel:
    """A kernel driven as a front end drives it: each request's IOPub messages, as they come."""

    def __init__(self, cwd, env):
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(cwd=str(cwd), env=env)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str, during=None) -> tuple[dict, list[dict]]:
        """The reply to ``code`` and the IOPub messages up to its idle, whatever request each names as its parent;
        ``during(message)`` sees each as it comes."""
        msg_id = self.client.execute(code)
        messages = []
        while True:
            message = self.client.get_iopub_msg(timeout=240)
            messages.append(message)
            if during is not None:
                during(message)
            if message["parent_header"].get("msg_id") == msg_id and message["content"].get("execution_state") == "idle":
                return self.client.get_shell_msg(timeout=60), messages

    def later(self, seconds: float) -> list[dict]:
        """The IOPub messages that come within ``seconds``, of whatever request."""
        messages, end = [], time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            try:
                messages.append(self.client.get_iopub_msg(timeout=left))
            except queue.Empty:
                break
        return messages

    def threads(self) -> list[str]:
        _, messages = self.run("import threading; print([t.name for t in threading.enumerate()])")
        return [m["content"]["text"] for m in messages if m["msg_type"] == "stream"]

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def _line(reply: dict, messages: list[dict]) -> list[tuple[float, str]]:
    """Each text the progress line was given, with the kernel's time of sending it (seconds); each went to the
    cell that ran, the ticker's included (ipykernel 7 keeps the request a thread sends for in its context)."""
    shown = next(
        m
        for m in messages
        if m["msg_type"] == "display_data" and m["content"]["data"].get("text/plain", "").startswith("dcnb: Mish: ")
    )
    updates = [
        m
        for m in messages
        if m["msg_type"] == "update_display_data"
        and m["content"]["transient"]["display_id"] == shown["content"]["transient"]["display_id"]
    ]
    cell = reply["parent_header"]["msg_id"]
    assert all(m["parent_header"]["msg_id"] == cell for m in [shown, *updates])
    return [(m["header"]["date"].timestamp(), m["content"]["data"]["text/plain"]) for m in updates]


def test_the_progress_line_ticks_each_second_through_the_phases_of_a_first_build(tmp_path, fresh_cache):
    kernel = _Kernel(tmp_path, dict(os.environ))
    try:
        kernel.run(SETUP)
        reply, messages = kernel.run(SLOW_EXPORT.format(extra=""))
        assert reply["content"]["status"] == "ok", reply["content"]
        updates = _line(reply, messages)
        assert updates[-1][1] == "", "the line is emptied once the session is built"
        lines = [(t, LINE.fullmatch(text)) for t, text in updates[:-1]]
        assert all(match for _, match in lines), updates
        # each phase as it comes (one of a few milliseconds may be passed over), the compiles' stages among them
        phases = list(dict.fromkeys(match["phase"] for _, match in lines))
        assert len(phases) >= 6, phases
        lasting = ["exporting to ONNX", "importing into DaCe", "compiling the backward", "drawing the session's graphs"]
        order = [next(i for i, p in enumerate(phases) if p.startswith(s)) for s in lasting]
        assert order == sorted(order), phases
        # while the export lasts, the line goes on each second: its seconds in the phase count up, and in all
        export = [(t, match) for t, match in lines if match["phase"] == "exporting to ONNX"]
        assert [int(m["this"] or 0) for _, m in export] == list(range(len(export))) and len(export) >= 4, updates
        alls = [int(m["all"]) for _, m in export]
        assert alls == sorted(alls) and alls[-1] - alls[0] >= 3, updates
        gaps = [b - a for (a, _), (b, _) in zip(export, export[1:])]
        assert all(0.5 < gap < 1.5 for gap in gaps), gaps
        assert not any(TICKER in text for text in kernel.threads())

        # the kernel's stop button: the cell stops, the line is emptied and says nothing more
        stopped = []

        def interrupt(message: dict) -> None:
            text = message["content"].get("data", {}).get("text/plain", "")
            if not stopped and "exporting to ONNX (1 s in this phase" in text:
                stopped.append(time.monotonic())
                kernel.manager.interrupt_kernel()

        reply, messages = kernel.run(SLOW_EXPORT.format(extra="--as again"), during=interrupt)
        assert stopped and reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        updates = _line(reply, messages)
        assert updates[-1][1] == "" and time.monotonic() - stopped[0] < 3
        late = kernel.later(1.2)
        assert not [m for m in late if m["msg_type"] == "update_display_data"], late
        assert not any(TICKER in text for text in kernel.threads())
    finally:
        kernel.close()
