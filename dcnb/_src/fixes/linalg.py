"""Linear algebra: Einsum's backward, MatMul of vectors, and matrix products through a BLAS."""

from __future__ import annotations

import copy

import dace
from dace.autodiff.implementations.onnx_ops import DefaultEinsumBackward
from dace.frontend.common.einsum import create_einsum_sdfg
from dace.libraries.blas.nodes.batched_matmul import (
    BatchedMatMul,
    ExpandBatchedMatMulOpenBLAS,
    ExpandBatchedMatMulPure,
)
from dace.libraries.blas.nodes.dot import Dot
from dace.libraries.blas.nodes.gemm import ExpandGemmOpenBLAS, Gemm
from dace.libraries.blas.nodes.gemv import Gemv
from dace.libraries.blas.nodes.matmul import _get_codegen_gemm_opts, _get_matmul_operands
from dace.libraries.linalg.nodes.transpose import Transpose
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.libraries.onnx.nodes.onnx_op_registry import ONNXEinsum
from dace.libraries.onnx.op_implementations.linalg_ops import PureEinsum, PureGemm, PureMatMul
from dace.registry import autoregister_params
from dace.sdfg.utils import in_desc_with_name, out_desc_with_name
from dace.transformation.transformation import ExpandTransformation

from .. import blas, gpu_libs
from ..names import readable
from .array_ops import broadcast_index
from .registry import CHOOSE, choice, default_backward, on_cpu, on_gpu_host, pure_expansion


@autoregister_params(op="Einsum", name="dcnb")
class EinsumBackwardOfTransients(DefaultEinsumBackward):
    # gap: DaCe's Einsum backward copies the forward descriptors into its nested SDFG as they are, so an
    # einsum reading a transient (a Linear after another op, once inlined) gives an invalid SDFG
    @staticmethod
    def backward(forward_node, context, given_gradients, required_gradients):
        node, result = DefaultEinsumBackward.backward(forward_node, context, given_gradients, required_gradients)
        for name in (*node.in_connectors, *node.out_connectors):
            node.sdfg.arrays[name].transient = False
        return node, result


default_backward("Einsum")


@pure_expansion("MatMul", name="dcnb")
class MatMulOfVectors(ONNXForward):
    # gap: DaCe's MatMul refuses an operand with one dimension (x @ v, v @ W, torch.outer's operands); as numpy does,
    # a vector on the left is a row, on the right a column, and that dimension is dropped from the result
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        # (a product of two vectors is a scalar, whose Einsum backward DaCe cannot generate)
        return any(len(in_desc_with_name(node, state, sdfg, n).shape) > 1 for n in ("A", "B"))

    @staticmethod
    def forward(node, state, sdfg):
        a, b = (in_desc_with_name(node, state, sdfg, n) for n in ("A", "B"))
        if len(a.shape) > 1 and len(b.shape) > 1:
            return PureMatMul.forward(node, state, sdfg)
        batch = "abcdefgh"
        if len(a.shape) == 1:
            lead = batch[: len(b.shape) - 2]
            equation = f"k,{lead}kj->{lead}j"
        else:
            lead = batch[: len(a.shape) - 2]
            equation = f"{lead}ik,k->{lead}i"
        nsdfg, nstate = _product_sdfg(node, {"A": a, "B": b, "Y": out_desc_with_name(node, state, sdfg, "Y")})
        _einsum_into(nsdfg, nstate, f"{node.label}_einsum", equation, nstate.add_write("Y"))
        return nsdfg


def _product_sdfg(node, arrays: dict[str, dace.data.Data]) -> tuple[dace.SDFG, dace.SDFGState]:
    """An empty expansion of ``node`` holding ``arrays`` (its connectors' descriptors) as arguments, and its state."""
    nsdfg = dace.SDFG(f"{node.label}_expansion")
    for name, desc in arrays.items():
        nsdfg.add_datadesc(name, copy.deepcopy(desc))
        nsdfg.arrays[name].transient = False
    return nsdfg, nsdfg.add_state()


def _einsum_into(nsdfg: dace.SDFG, nstate: dace.SDFGState, label: str, equation: str, result) -> None:
    """An ONNX Einsum of ``equation`` over the arrays A and B of ``nsdfg``, writing the access node ``result``."""
    einsum = ONNXEinsum(label, equation=equation)
    nstate.add_node(einsum)
    for k, name in enumerate(("A", "B")):
        einsum.add_in_connector(f"Inputs__{k}")
        nstate.add_edge(nstate.add_read(name), None, einsum, f"Inputs__{k}", nsdfg.make_array_memlet(name))
    nstate.add_edge(einsum, "Output", result, None, nsdfg.make_array_memlet(result.data))


@pure_expansion("Gemm", name="dcnb")
class GemmScaled(ONNXForward):
    # gap: DaCe's Gemm writes alpha and beta other than 1 as ``dace.float(0.5)``, on which autodiff fails
    # (torch.addmm(c, a, b, beta=0.5)), leaves a C it does not read out of its expansion where beta is 0 (an invalid
    # SDFG), and refuses a C broadcast from axes of size 1 (a bias per row)
    @staticmethod
    def forward(node, state, sdfg):
        y = out_desc_with_name(node, state, sdfg, "Y")
        c = in_desc_with_name(node, state, sdfg, "C") if "C" in node.in_connectors else None
        beta = node.beta if c is not None else 0
        added = c is not None and beta == 1 and tuple(c.shape) == tuple(y.shape[len(y.shape) - len(c.shape):])
        if node.alpha == 1 and (c is None or added):
            return PureGemm.forward(node, state, sdfg)
        arrays = {n: in_desc_with_name(node, state, sdfg, n) for n in ("A", "B")} | {"Y": y}
        if c is not None:  # connected, and read where beta is not 0
            arrays["C"] = c
        nsdfg, nstate = _product_sdfg(node, arrays)
        nsdfg.add_transient("product", y.shape, y.dtype)
        a, b = ("ki" if node.transA else "ik"), ("jk" if node.transB else "kj")
        product = nstate.add_access("product")
        _einsum_into(nsdfg, nstate, f"{node.label}_einsum", f"{a},{b}->ij", product)
        inputs = {"__p": dace.Memlet("product[i, j]")}
        code = f"__y = {float(node.alpha)!r} * __p"
        if beta:
            inputs["__c"] = dace.Memlet(f"C[{', '.join(broadcast_index(c, list(y.shape), ['i', 'j'])) or '0'}]")
            code += f" + {float(beta)!r} * __c"
        nstate.add_mapped_tasklet(
            f"{node.label}_scaled", {"i": f"0:{y.shape[0]}", "j": f"0:{y.shape[1]}"}, inputs, code,
            {"__y": dace.Memlet("Y[i, j]")}, external_edges=True, input_nodes={"product": product},
        )
        return nsdfg


@pure_expansion("Einsum", name="dcnb")
class EinsumWithoutUnitAxes(ONNXForward):
    # gap: DaCe's einsum views a transposed operand of a matrix product as a mere squeeze of its container when an
    # axis has size 1 (a batch of one, one head), taking the container's strides: the product then reads the
    # operand untransposed (q @ k.T's gradients with one head, any batched product's with a batch of one)
    @staticmethod
    def forward_can_be_applied(node, state, sdfg) -> bool:
        return PureEinsum.forward_can_be_applied(node, state, sdfg)

    @staticmethod
    def forward(node, state, sdfg):
        equation = node.equation.replace(" ", "")
        if "->" not in equation:
            return PureEinsum.forward(node, state, sdfg)
        inputs = list(node.iter_inputs_in_onnx_order(state))
        descs = [in_desc_with_name(node, state, sdfg, e.dst_conn) for e in inputs]
        descs.append(out_desc_with_name(node, state, sdfg, "Output"))
        terms = equation.replace("->", ",").split(",")
        sizes: dict[str, set] = {}
        for term, desc in zip(terms, descs):
            for letter, size in zip(term, desc.shape):
                sizes.setdefault(letter, set()).add(size)
        unit = {letter for letter, found in sizes.items() if found == {1}}
        squeezed = ["".join(c for c in term if c not in unit) for term in terms]
        if not unit or not all(squeezed):  # (an operand left without axes would be a scalar)
            return PureEinsum.forward(node, state, sdfg)
        nsdfg = dace.SDFG(f"{node.label}_expansion")
        nstate = nsdfg.add_state()
        names = [e.dst_conn for e in inputs] + ["Output"]
        for name, term, desc in zip(names, terms, descs):
            kept = [k for k, letter in enumerate(term) if letter not in unit]
            nsdfg.add_array(
                name, [desc.shape[k] for k in kept], desc.dtype, storage=desc.storage,
                strides=[desc.strides[k] for k in kept], total_size=desc.total_size,
            )
        wcr = state.out_edges(node)[0].data.wcr  # accumulating into a gradient: the product adds, as DaCe's does
        output = squeezed.pop()
        create_einsum_sdfg(
            nsdfg, nstate, f"{','.join(squeezed)}->{output}", *names[:-1], output="Output", beta=1 if wcr else 0
        )
        return nsdfg


#: per BLAS in ``blas.CHOICES``: DaCe's OpenBLAS expansion (a cblas call) linked with that BLAS's environment
IMPLEMENTATIONS = {name: f"dcnb_{name}" for name in blas.ENVIRONMENTS}

_BLAS_DTYPES = (dace.float32, dace.float64)


def _blas_applies(node, state, sdfg, expansion: type[ExpandTransformation]) -> bool:
    """Whether ``node`` runs on the CPU, in float32 or float64, in a layout DaCe's cblas call takes."""
    return on_cpu(node, state, sdfg) and _fits(node, state, sdfg, expansion)


def _fits(node, state, sdfg, expansion: type[ExpandTransformation]) -> bool:
    """Whether ``node`` is in float32 or float64, in a layout ``expansion`` (a column-major GEMM call) takes."""
    descs = [sdfg.arrays[e.data.data] for e in (*state.in_edges(node), *state.out_edges(node))]
    if len({d.dtype for d in descs}) != 1 or descs[0].dtype not in _BLAS_DTYPES:
        return False
    # gap: DaCe's cblas call reads a matrix with one column (strides 1, 1: torch.outer's operands) as column-major
    # with a leading dimension of 1, which the BLAS rejects, leaving the product unwritten
    if any(len(d.shape) >= 2 and d.strides[-1] == d.strides[-2] for d in descs):
        return False
    try:
        expansion.expansion(node, state, sdfg)  # builds a tasklet, changes nothing; raises where strides do not fit
    except Exception:  # noqa: BLE001 -- DaCe raises plain Exceptions for layouts cblas cannot take
        return False
    return True


def _choose(cblas_expansion: type[ExpandTransformation], unchecked: str | None = None):
    """cuBLAS for a node in GPU memory outside kernels, the BLAS for one on the CPU, where either applies, else
    DaCe's loops; ``unchecked``, where given, names loops for a node DaCe's own validation refuses wrongly."""

    def pick(node, state, sdfg) -> str:
        if on_gpu_host(node, state, sdfg) and _fits(node, state, sdfg, CUBLAS_EXPANSIONS[type(node)]):
            return CUBLAS
        found = blas.linked()
        if found is not None and _blas_applies(node, state, sdfg, cblas_expansion):
            return IMPLEMENTATIONS[found.name]
        if unchecked is not None:
            try:
                node.validate(sdfg, state)
            except ValueError:
                return unchecked
        return "pure"

    return choice(pick)


#: the implementation calling cuBLAS, registered on Gemm and BatchedMatMul
CUBLAS = "dcnb_cublas"


def _cublas_call(node, state, sdfg) -> dace.sdfg.nodes.Tasklet:
    """A host tasklet calling cuBLAS for ``node`` on the stream of the binary's kernels: a GEMM, or one strided
    batched GEMM where the node multiplies batches (DaCe's column-major view of the row-major operands, as its cblas
    calls take them, is cuBLAS's own convention)."""
    node.validate(sdfg, state)
    (_, adesc, *_), (_, bdesc, *_), _ = _get_matmul_operands(node, state, sdfg)
    cdesc = sdfg.arrays[state.out_edges(node)[0].data.data]
    if any(d.storage != dace.StorageType.GPU_Global for d in (adesc, bdesc, cdesc)):
        raise ValueError(f"{readable(node.label)}: cuBLAS reads GPU memory only")
    # BatchedMatMul has no alpha or beta: its product is written, as DaCe's cblas expansion writes it
    alpha, beta = (node.alpha, node.beta) if isinstance(node, Gemm) else (1, 0)
    ctype = cdesc.dtype.ctype
    opt = _get_codegen_gemm_opts(
        node, state, sdfg, adesc, bdesc, cdesc, f"({ctype}){float(alpha)!r}", f"({ctype}){float(beta)!r}", ctype, ""
    )
    head = "__state->dcnb_cublas.handle, CUBLAS_OP_{ta}, CUBLAS_OP_{tb}, {M}, {N}, {K}, {alpha}".format_map(opt)
    if opt["BATCH"] is None:
        call = f"dcnb_gpu::gemm({head}, {{x}}, {{lda}}, {{y}}, {{ldb}}, {{beta}}, _c, {{ldc}})".format_map(opt)
    else:
        call = (
            f"dcnb_gpu::gemm_batched({head}, {{x}}, {{lda}}, {{stride_a}}, {{y}}, {{ldb}}, {{stride_b}}, {{beta}}, "
            "_c, {ldc}, {stride_c}, {BATCH})"
        ).format_map(opt)
    code = f"if (!__state->dcnb_cublas.on(__dace_current_stream) || {call} != 0) {{\n{gpu_libs.FAILED}\n}}"
    return dace.sdfg.nodes.Tasklet(
        node.name, node.in_connectors, node.out_connectors, code, language=dace.dtypes.Language.CPP
    )


@dace.library.expansion
class ExpandGemmCublas(ExpandTransformation):
    # gap: DaCe's cuBLAS expansion needs cublas_v2.h and -lcublas when the binary is built (absent where dcnb builds
    # for CUDA without a GPU): products in GPU memory ran as DaCe's loop kernels; they call PyTorch's cuBLAS now
    environments = [gpu_libs.CuBLAS]
    expansion = staticmethod(_cublas_call)


@dace.library.expansion
class ExpandBatchedMatMulCublas(ExpandTransformation):
    # gap: as Gemm's, one strided batched GEMM per node
    environments = [gpu_libs.CuBLAS]
    expansion = staticmethod(_cublas_call)


#: the cuBLAS expansion of each node type dcnb chooses for
CUBLAS_EXPANSIONS = {Gemm: ExpandGemmCublas, BatchedMatMul: ExpandBatchedMatMulCublas}


@dace.library.expansion
class ExpandGemmDcnb(ExpandTransformation):
    # gap: DaCe's BLAS nodes expand to loops (config default "pure") unless auto_optimize's set_fast_implementations
    # names a BLAS: naive builds and autodiff's backward never called one; CPU products in float now call a BLAS
    environments = []
    expansion = _choose(ExpandGemmOpenBLAS)


@dace.library.expansion
class ExpandBatchedMatMulUnchecked(ExpandTransformation):
    # gap: DaCe's BatchedMatMul validation squeezes an operand's axes of size 1, then finds the k-dimension of a
    # product with one column (b x k x 1: x @ w, attention pooling with one query) unequal to the batch, and every
    # implementation validates first: auto_optimize (whose simplify has the node read the b x k x 1 array) raised.
    # DaCe's loops, which index the unsqueezed operands
    environments = []
    expansion = staticmethod(ExpandBatchedMatMulPure.make_sdfg)


@dace.library.expansion
class ExpandBatchedMatMulDcnb(ExpandTransformation):
    # gap: as Gemm's (attention's batched products, forward and backward)
    environments = []
    expansion = _choose(ExpandBatchedMatMulOpenBLAS, unchecked="dcnb_unchecked")


class _BatchedMatMulOneCall(ExpandBatchedMatMulOpenBLAS):
    # gap: DaCe's cblas expansion of a batched product loops over one GEMM per matrix, each small one (attention's
    # 128x64 blocks) run on all threads in turn: 1.2x eager's bmm, which hands MKL the batch whole. Where the BLAS
    # has a batched GEMM (blas.Blas.batched), one call of it; else DaCe's loop
    @staticmethod
    def expansion(node, state, sdfg):
        found = blas.linked()
        if found is None or not found.batched:
            return ExpandBatchedMatMulOpenBLAS.expansion(node, state, sdfg)
        node.validate(sdfg, state)
        (_, adesc, *_), (_, bdesc, *_), _ = _get_matmul_operands(node, state, sdfg)
        cdesc = sdfg.arrays[state.out_edges(node)[0].data.data]
        ctype = cdesc.dtype.ctype
        opt = _get_codegen_gemm_opts(node, state, sdfg, adesc, bdesc, cdesc, f"({ctype})1", f"({ctype})0", ctype, "")
        opt["ta"], opt["tb"] = ("CblasNoTrans" if opt[t] == "N" else "CblasTrans" for t in ("ta", "tb"))
        code = (
            "dcnb_gemm_batched({ta}, {tb}, {M}, {N}, {K}, {alpha}, ({dtype}*){x}, {lda}, {stride_a}, ({dtype}*){y}, "
            "{ldb}, {stride_b}, {beta}, ({dtype}*)_c, {ldc}, {stride_c}, {BATCH});"
        ).format_map(opt)
        return dace.sdfg.nodes.Tasklet(
            node.name, node.in_connectors, node.out_connectors, code, language=dace.dtypes.Language.CPP
        )


def _linked(base: type[ExpandTransformation], name: str) -> type[ExpandTransformation]:
    """DaCe's cblas expansion ``base`` with the environment that links the BLAS ``name``."""
    cls = type(f"{base.__name__}_dcnb_{name}", (base,), {"environments": [blas.ENVIRONMENTS[name]]})
    globals()[cls.__name__] = cls  # a module-level name, as DaCe's own expansions have
    return dace.library.expansion(cls)


# gap: DaCe's OpenBLAS environment links whatever libblas.so.3 points to (OpenBLAS's pthreads build when both are
# installed, which fights OpenMP's threads for the cores) and needs LAPACK and LAPACKE besides; its MKL one needs
# mkl.h and mkl_rt, which PyTorch's wheel, calling MKL itself, does not ship
for _node, _choose_cls, _cblas in (
    (Gemm, ExpandGemmDcnb, ExpandGemmOpenBLAS),
    (BatchedMatMul, ExpandBatchedMatMulDcnb, ExpandBatchedMatMulOpenBLAS),
):
    _node.register_implementation(CHOOSE, _choose_cls)
    _node.register_implementation(CUBLAS, CUBLAS_EXPANSIONS[_node])
    for _name, _implementation in IMPLEMENTATIONS.items():
        _base = _BatchedMatMulOneCall if _node is BatchedMatMul and _name in ("onednn", "torch") else _cblas
        _node.register_implementation(_implementation, _linked(_base, _name))
    _node.default_implementation = CHOOSE
BatchedMatMul.register_implementation("dcnb_unchecked", ExpandBatchedMatMulUnchecked)


@dace.library.expansion
class ExpandLoops(ExpandTransformation):
    # gap: auto_optimize gives every node that has one DaCe's own OpenBLAS implementation (transposes, vector
    # products), whose cblas.h clashes in one build with the declarations of the BLAS dcnb links for the matrix
    # products ("multiple definition of enum CBLAS_ORDER"): where dcnb's choice comes first, these keep DaCe's loops
    environments = []
    expansion = choice(lambda node, state, sdfg: "pure")


for _node in (Transpose, Gemv, Dot):
    _node.register_implementation(CHOOSE, ExpandLoops)
