import os
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# builds are cached by content: reruns of the suite reuse them (tests that count builds use their own cache)
os.environ.setdefault("DCNB_CACHE", str(ROOT / ".cache" / "dcnb-test"))
# a CUDA build of every step in the background would take a minute each here: the tests that want it ask for it
os.environ.setdefault("DCNB_CUDA_BUILD", "0")
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# what works in this sandbox: no GPU, no sandboxing, nothing fetched from the network
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DCNB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def ip():
    """A real IPython shell with dcnb's extension loaded (the magic's tests)."""
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "dcnb")
    shell.run_cell("import torch\nfrom torch import nn")
    return shell


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    from playwright.sync_api import sync_playwright

    assert pathlib.Path(CHROMIUM).exists(), "Debian's chromium is needed (scripts/setup.sh installs it)"
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1100},
        )
        yield context
        context.close()


@pytest.fixture
def artifacts():
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def pytest_addoption(parser):
    parser.addoption("--zoo", action="store_true", help="also run the whole model zoo (tests marked zoo; make zoo)")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``zoo`` (the rest of the model zoo, tens of minutes of compiles) run only with --zoo."""
    if config.getoption("--zoo"):
        return
    kept = [item for item in items if item.get_closest_marker("zoo") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("zoo") is not None])
        items[:] = kept
