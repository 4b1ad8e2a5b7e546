# The two commands a newcomer runs (see README.md); each sets up what it needs first.
.PHONY: setup mish test zoo

setup:
	@./scripts/setup.sh

mish: setup
	.venv/bin/dcnb run notebooks/mish.ipynb --out out

test: setup
	.venv/bin/python -m pytest

# the whole model zoo: every entry in every mode, and every action on more kinds of graph (tests/compile/test_zoo.py)
zoo: setup
	.venv/bin/python -m pytest --zoo tests/compile/test_zoo.py
