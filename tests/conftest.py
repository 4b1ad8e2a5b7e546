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
