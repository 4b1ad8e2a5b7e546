# The two commands a newcomer runs (see README.md); each sets up what it needs first.
.PHONY: setup mish test unit zoo models ops notebooks cuda deep gpu gpu-wheels

setup:
	@./scripts/setup.sh

mish: setup
	.venv/bin/dcnb run notebooks/mish.ipynb --out out

# a test that hangs fails alone, with where it waited, after 15 minutes (the longest takes about 3 on these 2 cores),
# where it held CI until CI's own limit
test: setup
	.venv/bin/python -m pytest --timeout 900

# the fast loop: tests that build nothing (tests/unit, tests/test_smoke.py), in about a minute
unit: setup
	.venv/bin/python -m pytest tests/unit tests/test_smoke.py

# the whole model zoo: every entry in every mode, and every action on more kinds of graph (tests/compile/test_zoo.py)
zoo: setup
	.venv/bin/python -m pytest --zoo tests/compile/test_zoo.py

# every Hugging Face model (tests/hf_models.py) in eval and training mode (tests/compile/test_hf_models.py), and the
# session view on a ResNet-18's backward in JupyterLab (tests/ui/test_large_graphs.py)
models: setup
	.venv/bin/python -m pytest --models tests/compile/test_hf_models.py tests/ui/test_large_graphs.py

# every op of the catalog (tests/ops.py), forward and backward (tests/compile/test_ops.py), and with NaN and
# infinities in its inputs (tests/compile/test_special_values.py)
ops: setup
	.venv/bin/python -m pytest --ops tests/compile/test_ops.py tests/compile/test_special_values.py

# every notebook in notebooks/, run in a real kernel and opened in Chromium (tests/notebooks/test_notebooks.py)
notebooks: setup
	.venv/bin/python -m pytest --notebooks tests/notebooks

# the CUDA builds of more graphs than make test's, and of the GPU row recipe (tests/compile/test_cuda_build.py,
# tests/compile/test_rows_cuda.py, tests/compile/test_gpu_libs.py), their capture into CUDA graphs
# (tests/compile/test_native_cuda.py) and dcnb run's (tests/kernel/test_run.py)
cuda: setup
	.venv/bin/python -m pytest --cuda tests/compile/test_cuda_build.py tests/compile/test_rows_cuda.py tests/compile/test_gpu_libs.py \
		tests/compile/test_native_cuda.py tests/kernel/test_run.py

# more cases of what make test checks once: another action, mode, engine or variant of the same check (tests marked
# deep across tests/)
deep: setup
	.venv/bin/python -m pytest --deep -m deep

# on a machine with a GPU and a CUDA build of PyTorch, which setup's CPU wheel is not (its image's python3 by default;
# `make gpu PYTHON=...` takes another), in one command within 10 minutes on an H100: the CUDA call path, its graphs and
# the zoo on CUDA (tests/gpu), the Mish and norm benchmarks, the Hugging Face models' naive and best steps, one JSON
# line per figure (scripts/gpu.sh; docs/gpu.md). Where that machine reaches no package index, run `make gpu-wheels`
# here first: .whl/ then travels with the tree and gpu.sh installs from it.
gpu: PYTHON ?= python3
gpu:
	PYTHON=$(PYTHON) ./scripts/gpu.sh

gpu-wheels: setup
	./scripts/gpu_wheels.sh
