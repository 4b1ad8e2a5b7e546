"""Run a notebook headless through a real kernel and keep what a reader needs: the executed notebook and its HTML.

The notebook runs top to bottom in a fresh kernel (nbclient) whose working folder is the output folder, and stops
at the first cell that fails. Whatever happened, the executed notebook and an HTML report (nbconvert; dcnb's
outputs carry static SVGs and tables, so graphs and tables show without a kernel) are written. The text outputs
of cells tagged ``report`` are collected, for the console to print. What the kernel process itself writes to
its stderr (the kernel's own warnings, compiler noise, a crash in compiled code) goes to ``<name>.kernel.log``
next to them, so that the console shows the notebook's progress and report only.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import time
from collections.abc import Callable

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellControlSignal, CellExecutionError, CellTimeoutError, DeadKernelError
from nbconvert import HTMLExporter

#: cells with this tag have their text outputs printed by ``dcnb run``
REPORT_TAG = "report"
#: notebooks read it to pick their problem sizes ("small" in the test suite)
SCALE_VARIABLE = "DCNB_NOTEBOOK_SCALE"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclasses.dataclass(frozen=True)
class Report:
    """What running a notebook left behind."""

    notebook: pathlib.Path
    html: pathlib.Path
    #: what the kernel process wrote to its stderr
    kernel_log: pathlib.Path
    #: the failing cell's error (without terminal colours), None when every cell ran
    error: str | None
    #: the text output of each cell tagged ``report``, in order
    reported: list[str]
    seconds: float

    @property
    def ok(self) -> bool:
        return self.error is None


def run(
    path: str | os.PathLike,
    out_dir: str | os.PathLike = "out",
    *,
    scale: str | None = None,
    timeout: float = 1200,
    echo: Callable[[str], None] = lambda line: None,
    cuda_build: bool = False,
) -> Report:
    """Execute the notebook at ``path``; write ``<out_dir>/<name>.ipynb`` and ``<out_dir>/<name>.html``.

    ``scale`` sets DCNB_NOTEBOOK_SCALE for the kernel; ``timeout`` bounds each cell, in seconds; ``echo`` gets
    the progress as text: a line per code cell, its first line when it starts and its time when done.
    ``cuda_build`` keeps the CUDA build each CPU step makes in the background (DCNB_CUDA_BUILD, where not set): off
    by default, since a headless run ends with its kernel, before they would, and times its steps on the same cores.
    """
    source = pathlib.Path(path)
    out = pathlib.Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(source, as_version=4)
    env = dict(os.environ)
    env.setdefault("DCNB_CUDA_BUILD", "1" if cuda_build else "0")
    if scale is not None:
        env[SCALE_VARIABLE] = scale
    code_cells = sum(1 for c in nb.cells if c.cell_type == "code" and c.source.strip())
    started: dict[int, float] = {}
    done = [0]

    def on_start(cell, cell_index: int) -> None:
        if cell.cell_type != "code" or not cell.source.strip():
            return  # nbclient announces every cell, and skips these
        started[cell_index] = time.perf_counter()
        done[0] += 1
        first = next((line for line in cell.source.splitlines() if line.strip()), "")
        echo(f"[{done[0]:>2}/{code_cells}] {first[:80]}")

    def on_executed(cell, cell_index: int, execute_reply) -> None:
        echo(f"  ({time.perf_counter() - started.get(cell_index, time.perf_counter()):.1f} s)\n")

    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        # the widgets' state would make nbconvert draw their (unavailable) scripts instead of the static HTML
        store_widget_state=False,
        resources={"metadata": {"path": str(out)}},
        on_cell_start=on_start,
        on_cell_executed=on_executed,
    )
    error = None
    start = time.perf_counter()
    kernel_log = out / f"{source.stem}.kernel.log"
    try:
        with kernel_log.open("w") as log:
            client.execute(env=env, stderr=log)
    except CellExecutionError as e:
        error = _ANSI.sub("", str(e)).strip()
    except (CellTimeoutError, DeadKernelError, CellControlSignal) as e:
        error = f"{type(e).__name__}: {_ANSI.sub('', str(e)).strip()}"
    seconds = time.perf_counter() - start
    executed = out / source.name
    nbformat.write(nb, executed)
    html = executed.with_suffix(".html")
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb, resources={"metadata": {"name": source.stem}})
    html.write_text(body, encoding="utf-8")
    reported = [_text(c) for c in nb.cells if c.cell_type == "code" and REPORT_TAG in c.metadata.get("tags", [])]
    return Report(executed, html, kernel_log, error, reported, seconds)


def _text(cell) -> str:
    """A cell's outputs as a terminal shows them: streams and the plain-text form of results."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data") and "text/plain" in output.get("data", {}):
            parts.append(output.data["text/plain"] + "\n")
        elif output.output_type == "error":
            parts.append(f"{output.ename}: {output.evalue}\n")
    return "".join(parts).rstrip("\n")
