#!/usr/bin/env bash
# make gpu-wheels: what `make gpu` needs on a GPU machine that reaches no package index and whose image has PyTorch
# (a CUDA build) but not DaCe, put in .whl/ for scripts/gpu.sh to install there: DaCe (built here from its sdist:
# it has no wheel) and the packages of its that such images lack (its ONNX simplifier among them), at the versions
# setup installs here; numpy, networkx and transformers at ours too, the versions our importer and model catalog are
# tested with (pyproject.toml). For that machine's Python (GPU_PYTHON, 3.12 by default) on x86-64 Linux.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
TARGET=${GPU_PYTHON:-3.12}
mkdir -p .whl
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
"$PY" -m pip wheel -q --no-deps -w .whl "dace==$(version dace)"
for package in astunparse fparser dill ply ordered-set numpy networkx onnxsim transformers; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$TARGET" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$package==$(version "$package")"
done
ls .whl
