"""dcnb's simplify (passes/simplify.py): DaCe's pipeline, with what it cannot carry out left undone."""

import dace
from dace.libraries.blas import Gemm

from dcnb._src.passes.simplify import simplify


def _product_into_a_reshape() -> tuple[dace.SDFG, Gemm]:
    """A matrix product written through a (32, 32) view of a (2, 16, 32) view of a (2, 16, 4, 8) array, as a MatMul's
    backward writes its input's gradient in place when the input was a reshaped transpose."""
    sdfg = dace.SDFG("product_into_a_reshape")
    for name, shape in (("A", (32, 32)), ("B", (32, 32)), ("C", (2, 16, 4, 8))):
        sdfg.add_array(name, shape, dace.float32)
    sdfg.add_view("matrix", (32, 32), dace.float32)
    sdfg.add_view("rows", (2, 16, 32), dace.float32)
    state = sdfg.add_state()
    a, b, matrix, rows, c = (state.add_access(name) for name in ("A", "B", "matrix", "rows", "C"))
    gemm = Gemm("gemm")
    state.add_node(gemm)
    state.add_edge(a, None, gemm, "_a", dace.Memlet("A[0:32, 0:32]"))
    state.add_edge(b, None, gemm, "_b", dace.Memlet("B[0:32, 0:32]"))
    state.add_edge(gemm, "_c", matrix, None, dace.Memlet("matrix[0:32, 0:32]"))
    state.add_edge(matrix, "views", rows, None, dace.Memlet("rows[0:2, 0:16, 0:32]"))
    state.add_edge(rows, "views", c, None, dace.Memlet("C[0:2, 0:16, 0:4, 0:8]"))
    return sdfg, gemm


def test_a_library_node_keeps_the_matrix_view_it_writes():
    # DaCe's RedundantArray merged the matrix view into the 3-d one: "matrix-matrix product only supported on
    # matrices" (a transformer block's auto_optimize, built for CUDA)
    sdfg, gemm = _product_into_a_reshape()
    simplify(sdfg)
    sdfg.validate()
    (written,) = next(iter(sdfg.states())).out_edges(gemm)
    assert written.data.subset.dims() == 2 and written.data.data == "matrix"
