"""The notebooks are stored without outputs, so that the repository stays small and diffs stay readable."""

import pathlib

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_a_stored_notebook_is_valid_and_has_no_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert "widgets" not in nb.metadata
    # notebooks pick their sizes from DCNB_NOTEBOOK_SCALE, which the suite sets to "small"
    assert "DCNB_NOTEBOOK_SCALE" in "".join(c.source for c in code)
