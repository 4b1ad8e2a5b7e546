"""A real JupyterLab server, a browser tab on it (the browser and the artifacts folder come from tests/conftest.py)."""

import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

TOKEN = "dcnb-ui-test"


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_lab(folder: pathlib.Path, home: pathlib.Path):
    """JupyterLab serving `folder`, its settings and runtime files under `home`; yields its base url (also used by
    benchmarks/view.py)."""
    # no "would you like news?" popup over the notebook
    settings = home / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port = _free_port()
    jupyter = pathlib.Path(sys.executable).parent / "jupyter"
    env = dict(
        os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_RUNTIME_DIR=str(home / "runtime")
    )
    with open(home / "server.log", "w") as log:
        server = subprocess.Popen(
            [
                str(jupyter), "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
                f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={folder}",
                "--allow-root", "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.extension_manager=readonly",
                f"--LabApp.user_settings_dir={home / 'settings'}", f"--LabApp.workspaces_dir={home / 'workspaces'}",
            ],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_for(base, server, home)
            yield base
        finally:
            server.terminate()
            server.wait(timeout=20)


def _wait_for(base: str, server: subprocess.Popen, home: pathlib.Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=2)
            return
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("JupyterLab did not start:\n" + (home / "server.log").read_text()[-3000:])
            time.sleep(0.5)


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """JupyterLab serving a fresh folder; yields (base url, folder)."""
    folder = tmp_path_factory.mktemp("lab")
    with serve_lab(folder, tmp_path_factory.mktemp("lab-home")) as base:
        yield base, folder


@pytest.fixture
def page(browser, artifacts, request):
    """A browser tab; what it showed last is kept as test-artifacts/ui-last-<test>.png, and what went wrong in it
    (a view that could not render says so only in the console) is printed."""
    tab = browser.new_page()
    errors = []
    tab.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    tab.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    yield tab
    print(*errors, sep="\n")
    if not tab.is_closed():
        tab.screenshot(path=str(artifacts / f"ui-last-{request.node.name}.png"))
        tab.close()


def run_all(page, path: str) -> None:
    """Run every cell of the notebook at `path` once it is the tab shown and its kernel is idle (JupyterLab reopens
    an earlier test's notebook beside it, which can be the tab shown for a moment)."""
    shown = f"window.jupyterapp?.shell.currentWidget?.context?.path === {path!r}"
    page.wait_for_function(f"() => {shown} && window.jupyterapp.shell.currentWidget.sessionContext?.session?.kernel")
    page.wait_for_function(
        f"() => {shown} && window.jupyterapp.shell.currentWidget.sessionContext.session?.kernel?.status === 'idle'",
        timeout=60_000,
    )
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
