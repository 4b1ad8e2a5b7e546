# The two commands a newcomer runs (see README.md); each sets up what it needs first.
.PHONY: setup mish test

setup:
	@./scripts/setup.sh

mish: setup
	.venv/bin/dcnb run notebooks/mish.ipynb --out out

test: setup
	.venv/bin/python -m pytest
