"""The public surface, imported as a user would."""

import importlib.metadata

import dcnb


def test_public_names():
    assert set(dcnb.__all__) >= {"optimize", "replay", "Session", "Step", "DcnbModule", "DcnbError"}
    for name in dcnb.__all__:
        assert getattr(dcnb, name) is not None


def test_version_matches_the_installed_distribution():
    # a stale install (metadata from an older checkout) shows here; package.json and the widget: test_views
    assert importlib.metadata.version("dcnb") == dcnb.__version__
