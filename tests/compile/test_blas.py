"""Matrix products call a BLAS from the naive step on, forward and backward (dcnb/_src/blas.py, fixes/linalg.py).

Without the fixes, DaCe's BLAS nodes expand to loops outside auto_optimize: the generated code has no cblas call.
Every session step checks outputs and gradients against PyTorch; the tests check that the code calls the BLAS.
"""

import pathlib

import dace
import numpy as np
import pytest
import torch
from torch import nn

import dcnb
from dcnb._src import blas
from dcnb._src.fixes import linalg
from tests.models import TinyMLP

pytestmark = pytest.mark.compile

AVAILABLE = blas.available()
needs_blas = pytest.mark.skipif(not AVAILABLE, reason="no BLAS here (scripts/setup.sh installs OpenBLAS)")


def _code(sdfg: dace.SDFG) -> str:
    return "".join(p.read_text() for p in sorted(pathlib.Path(sdfg.build_folder, "src", "cpu").glob("*.cpp")))


def _environments(sdfg: dace.SDFG) -> str:
    return pathlib.Path(sdfg.build_folder, "dace_environments.csv").read_text()


def _assert_calls_blas(session, name: str, calls: int) -> None:
    step = session.current
    assert step.ok and step.check.ok, step.error
    environment = blas.ENVIRONMENTS[name].full_class_path()
    for sdfg in (session.forward_sdfg, session.backward_sdfg):
        code = _code(sdfg)
        assert code.count("cblas_sgemm(") + code.count("dcnb_gemm_batched(") >= calls, sdfg.name
        assert "_BatchedMatMult_" not in code and "gemm_init" not in code  # none of DaCe's loops
        assert environment in _environments(sdfg)


@needs_blas
def test_linear_layers_call_the_blas():
    # DaCe's BLAS nodes expanded to loops unless auto_optimize named a BLAS: naive builds and backwards never did
    session = dcnb.optimize(TinyMLP(), torch.randn(8, 16), baselines=(), time_budget=0.01)
    _assert_calls_blas(session, AVAILABLE[0], calls=2)
    assert {"grad x", "grad fc1.weight", "grad fc2.weight"} <= set(session.current.check.errors)


class _Batched(nn.Module):
    """A Linear on 3-d input (a MatMul), then batched products, one of them of y with itself: y's gradient adds
    two batched products up."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.w = nn.Parameter(torch.randn(2, 4, 3))

    def forward(self, x):
        y = self.fc(x) @ self.w
        return y @ y.transpose(-1, -2)


@pytest.mark.parametrize("name", AVAILABLE or ["none"])
def test_batched_products_call_each_blas(name, monkeypatch):
    # as Gemm's, for batched products (attention's); each BLAS dcnb can link here, linked as its environment says
    if name == "none":
        pytest.skip("no BLAS here (scripts/setup.sh installs OpenBLAS)")
    monkeypatch.setenv("DCNB_BLAS", name)
    torch.manual_seed(0)
    session = dcnb.optimize(_Batched(), torch.randn(2, 5, 4), baselines=(), time_budget=0.01)
    _assert_calls_blas(session, name, calls=3)
    assert {"output", "grad x", "grad fc.weight", "grad w"} <= set(session.current.check.errors)


@pytest.mark.skipif(
    "torch" not in AVAILABLE or not blas._torch().batched, reason="this PyTorch's BLAS has no batched GEMM"
)
def test_a_batched_product_is_one_call_of_the_blas_batched_gemm(monkeypatch):
    # DaCe's cblas expansion loops over one GEMM per matrix, each small one on all threads in turn (1.2x eager's
    # bmm); MKL's batched GEMM takes the batch whole, as eager's bmm gives it. Forward and backward, and the check
    monkeypatch.setenv("DCNB_BLAS", "torch")
    torch.manual_seed(0)
    session = dcnb.optimize(_Batched(), torch.randn(2, 5, 4), baselines=(), time_budget=0.01)
    _assert_calls_blas(session, "torch", calls=1)
    for sdfg in (session.forward_sdfg, session.backward_sdfg):
        code = _code(sdfg)
        assert "dcnb_gemm_batched(" in code and "__ib" not in code, sdfg.name


# --- which expansion a BLAS node gets (code generation only, nothing compiled) ---------------------------------


def _generated(dtype, transposed: bool = False) -> tuple[str, set[str]]:
    """The code and environments DaCe generates for a matrix product ``A @ B`` (or ``A.T @ B``) of ``dtype``."""

    @dace.program
    def product(A: dtype[16, 8], B: dtype[8, 4], C: dtype[16, 4]):
        C[:] = A @ B

    @dace.program
    def product_t(A: dtype[8, 16], B: dtype[8, 4], C: dtype[16, 4]):
        C[:] = np.transpose(A) @ B

    sdfg = (product_t if transposed else product).to_sdfg(simplify=True)
    objects = sdfg.generate_code()
    return "".join(o.clean_code for o in objects), set().union(*(o.environments for o in objects))


@needs_blas
@pytest.mark.parametrize("name", AVAILABLE)
def test_float_products_call_the_chosen_blas(name, monkeypatch):
    monkeypatch.setenv("DCNB_BLAS", name)
    for dtype, call in ((dace.float32, "cblas_sgemm("), (dace.float64, "cblas_dgemm(")):
        code, environments = _generated(dtype)
        assert call in code
        assert blas.ENVIRONMENTS[name].full_class_path() in environments


def test_other_products_keep_dace_loops(monkeypatch):
    # integers have no BLAS; DCNB_BLAS=none asks for DaCe's loops
    code, environments = _generated(dace.int64)
    assert "cblas_" not in code and not environments & {e.full_class_path() for e in blas.ENVIRONMENTS.values()}
    monkeypatch.setenv("DCNB_BLAS", "none")
    code, _ = _generated(dace.float32)
    assert "cblas_" not in code
    assert blas.key() == "none"


def test_blas_choice_is_in_the_build_key(monkeypatch):
    monkeypatch.setenv("DCNB_BLAS", "none")
    without = blas.key()
    for name in AVAILABLE:
        monkeypatch.setenv("DCNB_BLAS", name)
        assert blas.key() not in (without, "") and name in blas.key()
    monkeypatch.setenv("DCNB_BLAS", "mkl")
    with pytest.raises(ValueError, match="DCNB_BLAS must be one of"):
        blas.chosen()


@pytest.mark.skipif("openblas" not in AVAILABLE, reason="Debian's OpenMP build of OpenBLAS is not installed")
def test_openblas_is_the_openmp_build_by_path():
    # DaCe's OpenBLAS environment links whatever libblas.so.3 points to (the pthreads build, whose threads fight
    # OpenMP's for the cores, when both are installed) and needs LAPACK and LAPACKE besides
    environment = blas.ENVIRONMENTS["openblas"]
    (library,) = environment.cmake_libraries()
    assert "openblas-openmp" in library and pathlib.Path(library).is_file()
    assert environment.cmake_packages == [] and "lapacke.h" not in environment.headers
    assert linalg.IMPLEMENTATIONS["openblas"] in dace.libraries.blas.Gemm.implementations
