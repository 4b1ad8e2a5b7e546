"""dcnb's simplify (passes/simplify.py): DaCe's pipeline, with what it cannot carry out left undone."""

import dace
import numpy as np
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


def _chained_blocks(count: int) -> dace.SDFG:
    """``count`` nested SDFGs in a chain, each with an input it does not read (a LayerNorm's backward and its bias):
    InlineSDFG takes none. InlineMultistateSDFG takes one only where none before it in the chain is left (it splits
    the state before and after it, and the one before writes two arrays, the next's input and one of its own), and
    DaCe's inlining tries the last first: a BERT's LayerNorm backwards, one after another."""
    sdfg = dace.SDFG("chained_blocks")
    state = sdfg.add_state()
    sdfg.add_array("a0", [8], dace.float32)
    sdfg.add_array("unused", [8], dace.float32)
    previous = state.add_access("a0")
    for k in range(count):
        inner = dace.SDFG(f"block{k}")
        for name in ("x", "u", "y", "g"):
            inner.add_array(name, [8], dace.float32)
        inner.add_state().add_mapped_tasklet(
            "scale", {"i": "0:8"}, {"v": dace.Memlet("x[i]")}, "w = (v + 1) * 2\nh = v + 1",
            {"w": dace.Memlet("y[i]"), "h": dace.Memlet("g[i]")}, external_edges=True,
        )
        sdfg.add_array(f"a{k + 1}", [8], dace.float32)
        sdfg.add_array(f"g{k}", [8], dace.float32)
        node = state.add_nested_sdfg(inner, {"x", "u"}, {"y", "g"})
        state.add_edge(previous, None, node, "x", dace.Memlet(f"{previous.data}[0:8]"))
        state.add_edge(state.add_access("unused"), None, node, "u", dace.Memlet("unused[0:8]"))
        previous = state.add_access(f"a{k + 1}")
        state.add_edge(node, "y", previous, None, dace.Memlet(f"a{k + 1}[0:8]"))
        state.add_edge(node, "g", state.add_access(f"g{k}"), None, dace.Memlet(f"g{k}[0:8]"))
    return sdfg


def test_nested_sdfgs_inlined_one_after_another_are_inlined_before_the_pipeline_not_one_in_each_round(calls):
    from dace.transformation.passes.fusion_inline import InlineSDFGs

    nested = lambda sdfg: sum(isinstance(n, dace.nodes.NestedSDFG) for n, _ in sdfg.all_nodes_recursive())
    ours, theirs = _chained_blocks(6), _chained_blocks(6)
    rounds = calls(InlineSDFGs, "apply_pass")
    theirs.simplify()
    by_dace = len(rounds)
    rounds.clear()
    simplify(ours)
    # DaCe's pipeline inlines one a round, runs each of its passes over the whole SDFG in each, and leaves the rest
    # nested once the states it split are fused again
    assert by_dace >= 3 and nested(theirs) >= 6 - by_dace
    assert len(rounds) <= 2 and nested(ours) == 0
    arrays = {name: np.zeros(8, np.float32) for name, desc in ours.arrays.items() if not desc.transient}
    arrays["a0"][:] = np.random.rand(8)
    ours(**arrays)
    expected = arrays["a0"]
    for k in range(6):
        np.testing.assert_allclose(arrays[f"g{k}"], expected + 1, rtol=1e-6)
        expected = (expected + 1) * 2
    np.testing.assert_allclose(arrays["a6"], expected, rtol=1e-6)
