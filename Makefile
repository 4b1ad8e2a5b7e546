# The two commands a newcomer runs (see README.md); each sets up what it needs first.
.PHONY: setup mish test

setup:
	@./scripts/setup.sh

mish: setup
	.venv/bin/dcnb demo

test: setup
	.venv/bin/python -m pytest
