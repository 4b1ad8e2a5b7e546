"""The public surface, imported as a user would."""

import re
import pathlib

import dcnb


def test_public_names():
    assert set(dcnb.__all__) >= {"optimize", "replay", "Session", "Step", "DcnbModule", "DcnbError"}
    for name in dcnb.__all__:
        assert getattr(dcnb, name) is not None


def test_version_matches_the_package_metadata():
    text = (pathlib.Path(__file__).parents[1] / "dcnb" / "_src" / "version.py").read_text()
    assert re.search(r'VERSION = "(.+)"', text).group(1) == dcnb.__version__
