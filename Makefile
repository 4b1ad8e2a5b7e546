# The two commands a newcomer runs (see README.md); each sets up what it needs first.
.PHONY: setup mish test zoo models ops notebooks cuda

setup:
	@./scripts/setup.sh

mish: setup
	.venv/bin/dcnb run notebooks/mish.ipynb --out out

test: setup
	.venv/bin/python -m pytest

# the whole model zoo: every entry in every mode, and every action on more kinds of graph (tests/compile/test_zoo.py)
zoo: setup
	.venv/bin/python -m pytest --zoo tests/compile/test_zoo.py

# every Hugging Face model (tests/hf_models.py) in eval and training mode (tests/compile/test_hf_models.py)
models: setup
	.venv/bin/python -m pytest --models tests/compile/test_hf_models.py

# every op of the catalog (tests/ops.py), forward and backward (tests/compile/test_ops.py)
ops: setup
	.venv/bin/python -m pytest --ops tests/compile/test_ops.py

# every notebook in notebooks/, run in a real kernel and opened in Chromium (tests/notebooks/test_notebooks.py)
notebooks: setup
	.venv/bin/python -m pytest --notebooks tests/notebooks

# the CUDA builds of more graphs than make test's (tests/compile/test_cuda_build.py)
cuda: setup
	.venv/bin/python -m pytest --cuda tests/compile/test_cuda_build.py
