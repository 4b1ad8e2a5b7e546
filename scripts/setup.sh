#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian/Ubuntu machine: system packages, then .venv/ with the CPU build of
# PyTorch and dcnb (editable) with its test dependencies. Re-running it only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

# graphviz draws the static SDFGs; chromium runs the JupyterLab UI tests (Playwright drives Debian's build)
APT_PACKAGES=(g++ make cmake python3-venv python3-dev graphviz chromium)
# OpenBLAS built with OpenMP (the BLAS matrix products call where PyTorch's own is not exported, see
# dcnb/_src/blas.py); LAPACKE's header, which DaCe's own OpenBLAS environment (auto_optimize's) includes
APT_PACKAGES+=(libopenblas-openmp-dev liblapacke-dev)
# the JupyterLab extension builds with node and npm: take Debian's only where none is installed
command -v node >/dev/null || APT_PACKAGES+=(nodejs)
command -v npm >/dev/null || APT_PACKAGES+=(npm)

missing=()
for pkg in "${APT_PACKAGES[@]}" ${DCNB_EXTRA_APT:-}; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=.venv/bin/python
[ -x "$PY" ] || python3 -m venv .venv
# a plain `torch` requirement would pull a multi-GB CUDA build; the CPU wheel comes first, from pip's cache
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"

stamp=.venv/.dcnb-installed
# reinstall when the package's definition or the extension's sources changed (the build compiles the extension)
if [ ! -f "$stamp" ] || [ -n "$(find pyproject.toml package.json labextension/src labextension/style -newer "$stamp" -print -quit)" ]; then
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q -e ".[test]"
    touch "$stamp"
fi
