import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# builds are cached by content: reruns of the suite reuse them (tests that count builds use their own cache)
os.environ.setdefault("DCNB_CACHE", str(ROOT / ".cache" / "dcnb-test"))


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
