"""Matrix products call a BLAS from the naive step on, forward and backward (dcnb/_src/blas.py, fixes/linalg.py).

Without the fixes, DaCe's BLAS nodes expand to loops outside auto_optimize: the generated code has no cblas call.
Every session step checks outputs and gradients against PyTorch; the tests check that the code calls the BLAS.
"""

import itertools
import pathlib
import time

import dace
import numpy as np
import pytest
import torch
from torch import nn

import dcnb
from dcnb._src import blas, forked, torch_kernels
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
    _assert_calls_blas(session, blas.chosen().name, calls=2)
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


class _Large(nn.Module):
    """Products of 128x128x128 multiply-adds and more: a Linear on 3-d input and a batched product, forward and
    backward (the weight's gradient a product over both batch dimensions)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(128, 128)

    def forward(self, x):
        y = self.fc(x)
        return y @ y.transpose(-1, -2)


def _onednn_products(capfd, call) -> int:
    """How many matrix products oneDNN runs during ``call()``, from its own log."""
    capfd.readouterr()
    with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
        call()
    return sum(",matmul," in line for line in capfd.readouterr().out.splitlines())


@pytest.mark.skipif("onednn" not in AVAILABLE, reason="this PyTorch has no oneDNN")
def test_large_float_products_run_through_onednn_and_small_ones_through_mkl(monkeypatch, capfd):
    # ATen runs MKL's GEMM for float products, and MKL takes its AVX-512 paths on Intel's CPUs only: oneDNN's matmul,
    # in the same library, is the faster elsewhere (an AMD EPYC: 0.45x MKL's time). Forward and backward, checked
    monkeypatch.setenv("DCNB_BLAS", "onednn")
    torch.manual_seed(0)
    x = torch.randn(2, 128, 128, requires_grad=True)
    session = dcnb.optimize(_Large(), x, baselines=(), time_budget=0.01)
    _assert_calls_blas(session, "onednn", calls=1)
    assert {"output", "grad x", "grad fc.weight", "grad fc.bias"} <= set(session.current.check.errors)
    # forward: the Linear and the batched product; backward: the weight's and x's gradients, the batched product's
    assert _onednn_products(capfd, lambda: session.module(x).sum().backward()) >= 5
    small = dcnb.optimize(TinyMLP(), torch.randn(8, 16, requires_grad=True), baselines=(), time_budget=0.01)
    _assert_calls_blas(small, "onednn", calls=2)
    assert _onednn_products(capfd, lambda: small.module(torch.randn(8, 16, requires_grad=True)).sum().backward()) == 0


@pytest.mark.skipif("onednn" not in AVAILABLE, reason="this PyTorch has no oneDNN")
@pytest.mark.parametrize("batch, shared", [(1, None), (3, None), (3, "a"), (3, "b")])
def test_the_bridge_multiplies_as_sgemm_does(batch, shared):
    # column-major operands, transposed or not, with leading dimensions past their rows, alpha and beta, a batch
    # whose one operand may be one matrix for all (stride 0): what DaCe's cblas calls and dcnb's batched call pass
    gemm, rng = blas.bridge_gemm(torch_kernels.bridge()), np.random.default_rng(0)
    m, n, k, pad = 5, 7, 4, 3
    for trans_a, trans_b, beta in itertools.product((0, 1), (0, 1), (0.0, 1.0)):
        rows_a, cols_a = (k, m) if trans_a else (m, k)
        rows_b, cols_b = (n, k) if trans_b else (k, n)
        a = rng.standard_normal((batch, cols_a, rows_a + pad), dtype=np.float32)  # column by column
        b = rng.standard_normal((batch, cols_b, rows_b + pad), dtype=np.float32)
        c = rng.standard_normal((batch, n, m + pad), dtype=np.float32)
        before = c.copy()
        stride_a = 0 if shared == "a" or batch == 1 else a[0].size
        stride_b = 0 if shared == "b" or batch == 1 else b[0].size
        done = gemm(
            trans_a, trans_b, m, n, k, 0.5, a.ctypes.data, rows_a + pad, stride_a, b.ctypes.data, rows_b + pad,
            stride_b, beta, c.ctypes.data, m + pad, c[0].size, batch,
        )  # fmt: skip
        assert done == 0
        for i in range(batch):
            op_a = a[0 if shared == "a" else i, :, :rows_a].T
            op_b = b[0 if shared == "b" else i, :, :rows_b].T
            op_a, op_b = (op_a.T if trans_a else op_a), (op_b.T if trans_b else op_b)
            want = 0.5 * op_a @ op_b + beta * before[i, :, :m].T
            np.testing.assert_allclose(c[i, :, :m].T, want, rtol=1e-5, atol=1e-5)
            assert np.array_equal(c[i, :, m:], before[i, :, m:])  # past the rows: untouched


def test_onednn_is_offered_only_where_aten_multiplies_floats_with_it(monkeypatch):
    # ATen's oneDNN matmul refused float products on an AMD EPYC (AVX2 alone), which offered oneDNN all the same:
    # every product asked of it failed over to MKL's GEMM
    monkeypatch.setenv("DCNB_BLAS", "onednn")
    if "onednn" in AVAILABLE:
        gemm, a, b, c = blas.bridge_gemm(torch_kernels.bridge()), *(np.ones((2, 2), np.float32) for _ in range(3))
        assert gemm(0, 0, 2, 2, 2, 1.0, a.ctypes.data, 2, 0, b.ctypes.data, 2, 0, 0.0, c.ctypes.data, 2, 0, 1) == 0
        np.testing.assert_array_equal(c, 2)
    else:
        with pytest.raises(ValueError, match="not available here"):
            blas.chosen()


@pytest.mark.skipif("onednn" not in AVAILABLE, reason="this PyTorch has no oneDNN")
@pytest.mark.deep
def test_products_call_mkl_where_the_bridge_to_onednn_does_not_build(fresh_cache, monkeypatch):
    # the bridge is built by the first product's expansion; where it cannot be, products keep MKL's GEMM
    monkeypatch.setenv("DCNB_BLAS", "onednn")
    with dace.config.set_temporary("compiler", "cpu", "executable", value="false"):
        with pytest.warns(UserWarning, match="could not build its bridge"):
            assert blas.linked().name == "torch"
    monkeypatch.setenv("DCNB_CACHE", str(fresh_cache / "elsewhere"))
    assert blas.linked().name == "onednn"  # (a cache where it builds)


@pytest.mark.skipif("onednn" not in AVAILABLE, reason="this PyTorch has no oneDNN")
def test_a_forked_process_inherits_the_measurement_and_does_not_hang(monkeypatch):
    # OpenMP's threads hang in a forked process once its parent has used them; dcnb transforms and compiles in
    # forked ones, where the first product's expansion asks which BLAS: the measurement is made before the fork
    monkeypatch.delenv("DCNB_BLAS", raising=False)
    blas.onednn_speedup.cache_clear()
    torch.mm(torch.rand(256, 256), torch.rand(256, 256))  # this process's OpenMP threads at work
    child = forked.Child(lambda: (blas.chosen().name, blas.onednn_speedup.cache_info().misses))
    deadline = time.monotonic() + 60
    while not child.done() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not child.done():
        child.stop()
        pytest.fail("the forked process hung")
    name, measured = child.result()
    child.reap()
    assert name == blas.chosen().name and measured == 1  # once, before the fork


@pytest.mark.skipif("onednn" not in AVAILABLE, reason="this PyTorch has no oneDNN")
def test_onednn_is_chosen_unasked_where_measured_faster(monkeypatch):
    monkeypatch.delenv("DCNB_BLAS", raising=False)
    speedup = blas.onednn_speedup()
    assert 0 < speedup < float("inf")
    assert blas.chosen().name == ("onednn" if speedup >= blas.ONEDNN_MARGIN else "torch")


@pytest.mark.skipif("onednn" not in AVAILABLE, reason="this PyTorch has no oneDNN")
def test_the_measurement_is_made_once_per_machine_and_every_process_reads_it(fresh_cache, monkeypatch):
    # two processes measuring at once on two cores chose apart, and so keyed the same graph's builds apart
    monkeypatch.delenv("DCNB_BLAS", raising=False)
    blas.onednn_speedup.cache_clear()
    try:
        measured = blas.onednn_speedup()
        (stored,) = (p for p in (fresh_cache / "measured").glob("onednn-speedup-*") if p.suffix != ".lock")
        assert float(stored.read_text()) == measured
        for speedup, name in ((blas.ONEDNN_MARGIN * 2, "onednn"), (blas.ONEDNN_MARGIN / 2, "torch")):
            stored.write_text(repr(speedup))  # what another process measured first
            blas.onednn_speedup.cache_clear()
            assert blas.onednn_speedup() == speedup and blas.chosen().name == name
        for wrong in ("", "nan", "-1.0"):  # cut short, or written wrong: measured again
            stored.write_text(wrong)
            blas.onednn_speedup.cache_clear()
            assert blas.onednn_speedup() == float(stored.read_text()) > 0
    finally:
        blas.onednn_speedup.cache_clear()  # the suite's own cache's measurement again


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
    keys = {blas.key()}
    for name in AVAILABLE:
        monkeypatch.setenv("DCNB_BLAS", name)
        assert blas.key().startswith(f"{name}:")
        keys.add(blas.key())
    assert len(keys) == len(AVAILABLE) + 1
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
