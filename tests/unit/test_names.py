"""Readable names (names.py) for what DaCe's ONNX importer, its expansions and autodiff call things, read
off the SDFGs of real modules: a transformer block, a conv net and GPT-2's block, imported and differentiated as a
session does (nothing compiled)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import warnings

import dace
import pytest
from dace.libraries.onnx.converters import clean_onnx_name
from dace.libraries.onnx.nodes.onnx_op import ONNXOp
from dace.sdfg import nodes
from torch import nn

from dcnb._src import frontend, names, passes, program
from dcnb._src.views import graph
from tests.hf_models import BY_NAME
from tests.zoo import CASES

#: clean_onnx_name's spellings: none is left in a readable name
MANGLED = re.compile("SLASH|DOT|COLON|DASH")
MODELS = ["transformer", "convnet", "gpt2_block"]


@dataclasses.dataclass
class Built:
    module: nn.Module
    imported: frontend.Imported
    #: forward (the import's passes ran: expansions inlined) and backward
    program: program.Program


@functools.cache
def _built(model: str) -> Built:
    if model in CASES:
        module, inputs = CASES[model].build()
    else:
        module, inputs, _ = BY_NAME[model].build()
    module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        imported = frontend.import_module(module, inputs, training=False)
        pre = copy.deepcopy(imported.sdfg)
        passes.run(passes.ON_IMPORT, pre)
        differentiated = program.differentiate(pre, imported, [*imported.param_paths, *imported.inputs])
    return Built(module, imported, differentiated)


@pytest.fixture(params=MODELS)
def built(request) -> Built:
    return _built(request.param)


def _everything(sdfg: dace.SDFG) -> list[tuple[str, str]]:
    """(raw, readable) for every array, node, nested SDFG and state of ``sdfg``, nested SDFGs' included."""
    found = []
    for g in sdfg.all_sdfgs_recursive():
        found.append((g.name, names.readable_sdfg(g.name)))
        found.extend((a, names.readable(a)) for a in g.arrays)
        for state in g.states():
            found.append((state.label, names.readable_state(state.label)))
            for node in state.nodes():
                if isinstance(node, (nodes.MapEntry, nodes.MapExit)):
                    found.append((node.map.label, names.readable_map(node.map.label)))
                elif not isinstance(node, nodes.AccessNode):
                    found.append((node.label, names.readable(node.label)))
    return found


def test_clean_onnx_names_read_back():
    assert names.readable(clean_onnx_name("ln1.weight")) == "ln1.weight"
    assert names.readable(clean_onnx_name("blocks.0.norm-1.weight")) == "blocks.0.norm-1.weight"
    assert names.readable(clean_onnx_name("/ln1/LayerNormalization")) == "ln1 · LayerNormalization"
    result = clean_onnx_name("/blocks/blocks.0/attn/MatMul_2_output_1")
    assert names.readable(result) == "blocks.blocks.0.attn · MatMul_2 output 1"
    # a value PyTorch numbered: DaCe puts ONNX_ before the digit
    assert clean_onnx_name("19") == "ONNX_19" and names.readable("gradient_ONNX_19") == "∇%19"


def test_parameters_inputs_and_their_gradients_read_as_the_modules_own(built):
    params = built.imported.param_paths
    assert any("DOT" in raw for raw in params)  # the names read here are mangled ones
    for raw, path in params.items():
        assert names.readable(raw) == path
    for raw in built.imported.inputs:
        assert names.readable(raw) == raw  # forward's argument names are plain identifiers
    grads = built.program.input_grads
    assert set(grads) == {*params, *built.imported.inputs}
    for wrt, gradient in grads.items():
        assert gradient in built.program.backward.arrays
        assert names.readable(gradient) == "∇" + names.readable(wrt)


def test_onnx_nodes_read_as_module_path_and_op(built):
    submodules = dict(built.module.named_modules())
    ops = [(n, s) for n, s in built.imported.sdfg.all_nodes_recursive() if isinstance(n, ONNXOp)]
    assert len(ops) > 5 and any(" · " in names.readable(n.label) for n, _ in ops)
    results = named = 0
    for node, state in ops:
        path, _, op = names.readable(node.label).rpartition(" · ")
        assert path == "" or path in submodules, node.label
        assert re.fullmatch(re.escape(node.schema.name) + r"(_\d+)?", op), node.label
        # the exporter names a node's results after it (the model's results and simplifier's nodes by a number)
        for edge in state.out_edges(node):
            results += 1
            if edge.data.data.startswith(node.label + "_output_"):
                named += 1
                pattern = re.escape(names.readable(node.label)) + r" output( \d+)?"
                assert re.fullmatch(pattern, names.readable(edge.data.data))
    assert named > 0.8 * results


def test_expansions_autodiff_and_states_read_without_dace_s_layers(built):
    forward, backward = built.program.forward, built.program.backward
    found = _everything(forward) + _everything(backward)
    assert sum(bool(MANGLED.search(raw)) for raw, _ in found) > 20
    assert not [readable for _, readable in found if MANGLED.search(readable)]
    submodules = dict(built.module.named_modules())
    for raw, readable in found:
        # an expansion's array inlined into its parent reads as the node it expanded, then its own name
        if "_expansion_" in raw and raw in forward.arrays:
            node, _, inner = readable.partition(" › ")
            assert inner and node.rpartition(" · ")[0] in ("", *submodules), raw
        if raw.startswith("gradient_") or raw.endswith("_grad"):
            assert "∇" in readable, raw
    # inlining splits a state again for each nested SDFG, and DaCe's labels grow by one "_pre_state" each time
    states = [state.label for g in (forward, backward) for state in g.states()]
    assert all(len(names.readable_state(s)) < 50 and "pre_state" not in names.readable_state(s) for s in states)
    # the backward's nested SDFGs are the backward rules of the forward's nodes
    nested = [n for n, _ in backward.all_nodes_recursive() if isinstance(n, nodes.NestedSDFG)]
    assert nested
    for node in nested:
        readable = names.readable_sdfg(node.sdfg.name)
        assert "backward" in readable and readable.rpartition(" · ")[0] in ("", *submodules), node.sdfg.name


def test_a_transformer_block_reads_as_its_module():
    forward, backward = _built("transformer").program.forward, _built("transformer").program.backward
    expected = {
        "norm1DOTweight": "norm1.weight",
        "self_attnDOTout_projDOTweight": "self_attn.out_proj.weight",
        "SLASHnorm1SLASHLayerNormalization_output_0": "norm1 · LayerNormalization output",
        "dace_libraries_onnx_op_implementations_array_ops_SLASHself_attnSLASHReshape_3_expansion_data_0": (
            "self_attn · Reshape_3 › data_0"
        ),
        "__return": "output",
    }
    for raw, readable in expected.items():
        assert raw in forward.arrays and names.readable(raw) == readable
    labels = {n.label for n, _ in forward.all_nodes_recursive() if isinstance(n, nodes.CodeNode)}
    assert "SLASHnorm1SLASHLayerNormalization" in labels
    assert names.readable("SLASHnorm1SLASHLayerNormalization") == "norm1 · LayerNormalization"
    assert "SLASHself_attnSLASHMatMul_einsum_expansion" in labels
    assert names.readable("SLASHself_attnSLASHMatMul_einsum_expansion") == "self_attn · MatMul (einsum)"
    assert "_Add_" in labels and names.readable("_Add_") == "Add"
    maps = {n.map.label for n, _ in forward.all_nodes_recursive() if isinstance(n, nodes.MapEntry)}
    assert "SLASHself_attnSLASHGather_1_tasklet_map" in maps
    assert names.readable_map("SLASHself_attnSLASHGather_1_tasklet_map") == "self_attn · Gather_1"

    gradients = {
        "gradient_SLASHself_attnSLASHSoftmax_output_0": "∇self_attn · Softmax output",
        "gradient_src_part": "∇src (part)",
        "SLASHnorm1SLASHLayerNormalization_output_0_grad": "∇norm1 · LayerNormalization output",
    }
    arrays = {a for g in backward.all_sdfgs_recursive() for a in g.arrays}
    for raw, readable in gradients.items():
        assert raw in arrays and names.readable(raw) == readable
    codes = {n.label: n for n, _ in backward.all_nodes_recursive() if isinstance(n, nodes.CodeNode)}
    assert names.readable_sdfg(codes["SLASHnorm1SLASHLayerNormalization_backward"].sdfg.name) == (
        "norm1 · LayerNormalization (backward)"
    )
    assert names.readable("SLASHlinear1SLASHMatMul_einsum_expansion_backward") == "linear1 · MatMul (einsum, backward)"
    assert "__Add__reverse_" in codes and names.readable("__Add__reverse_") == "Add (backward)"
    # (x's gradient has two parts, the residual's and the first layer's: each is added in)
    assert "accumulate_gradient_src" in codes
    assert names.readable("accumulate_gradient_src") == "accumulate ∇src"
    block = forward.start_state.label
    assert names.readable_state(block) == "block"
    # the states DaCe's multi-state inlining splits off are named after the state they came from: read as it
    assert names.readable_state(f"{block}_pre_state_pre_state_pre_state") == "block"
    (reversed_,) = [s.label for s in backward.states() if s.label.endswith("_reversed")]
    assert names.readable_state(reversed_) == "block (backward)"
    assert names.readable_sdfg(backward.name) == "TransformerEncoderLayer (backward)"


def test_an_expansion_s_nested_sdfg_reads_as_the_node_it_expands():
    sdfg = copy.deepcopy(_built("transformer").imported.sdfg)
    state = sdfg.start_state
    norm = next(n for n in state.nodes() if n.label == "SLASHnorm1SLASHLayerNormalization")
    norm.expand(sdfg, state)
    (nested,) = [n for n in state.nodes() if isinstance(n, nodes.NestedSDFG)]
    assert nested.sdfg.name.endswith("SLASHnorm1SLASHLayerNormalization_expansion")
    picture = graph.describe(sdfg)
    (drawn,) = [n for s in picture["states"] for n in s["nodes"] if n["kind"] == graph.NESTED]
    assert drawn["name"] == "norm1 · LayerNormalization (expansion)" and drawn["label"] == nested.label
    assert drawn["sdfg"]["name"] == "norm1 · LayerNormalization (expansion)"
    assert drawn["info"]["DaCe name"] == nested.label


def test_what_dcnb_s_passes_and_autodiff_add_reads_as_what_it_is_about():
    assert names.readable("zero_gradient_SLASHfc1SLASHAdd_output_0") == "zero ∇fc1 · Add output"
    assert names.readable_map("zero_gradient_SLASHSplit_output_1_map") == "zero ∇Split output 1"
    assert names.readable("gradient_fc1DOTbias_terms") == "∇fc1.bias (terms)"
    assert names.readable("add_gradient_fc1DOTbias_sums") == "add ∇fc1.bias (sums)"
    assert names.readable("sum_gradient_fc1DOTbias") == "sum ∇fc1.bias"
    # an expansion's own names stay as they are
    assert names.readable("sum_x_keepdims") == "sum_x_keepdims" and names.readable("exp_sums") == "exp_sums"


def test_an_op_of_the_module_itself_reads_after_the_module_s_class():
    assert names.readable("SLASHDiv_1_output_0") == "Div_1 output"
    assert names.readable("SLASHDiv_1_output_0", "PreNormBlock") == "PreNormBlock · Div_1 output"
    assert names.readable("SLASHfc1SLASHAdd_output_0", "PreNormBlock") == "fc1 · Add output"
    constant = names.readable("SLASHConstant_7_output_0_array", "PreNormBlock")
    assert constant == "PreNormBlock · Constant_7 output (array)"
    assert names.module_class("PreNormBlock_backward_ff4f139ee394b89f") == "PreNormBlock"


def test_a_name_says_which_op_it_is_of_forward_or_backward():
    assert names.origin("__map_fusion_SLASHfc1SLASHAdd_output_0") == names.Origin("fc1 · Add", backward=False)
    assert names.origin("gradient_SLASHfc1SLASHAdd_output_0") == names.Origin("fc1 · Add", backward=True)
    # inside an expansion or a backward rule, inlined
    inlined = "dace_libraries_onnx_op_implementations_normalization_ops_SLASHnorm1SLASHLayerNormalization_expansion_"
    assert names.origin(inlined + "mean") == names.Origin("norm1 · LayerNormalization", backward=False)
    assert names.origin("SLASHoutSLASHMatMul_einsum_expansion_backward_X") == names.Origin("out · MatMul", True)
    assert names.origin("fc1DOTweight") is None and names.origin("ONNX_19") is None and names.origin("mean") is None
    assert all(names.generic(n) for n in ("_Add_", "__Add__reverse_", "einsum_gemmgemm", "Reduce", "reduce_columns"))
    assert not any(names.generic(n) for n in ("SLASHfc1SLASHAdd", "accumulate_gradient_x", "sum_gradient_fc1DOTbias"))


def test_states_dace_labelled_itself_read_as_its_first_does():
    # the Python frontend's (an inlined expansion's state, kept by state fusion) read as an SDFG's first state
    assert names.readable_state("block") == names.readable_state("call_86_1") == "block"
    assert names.readable_state("BinOp_162_3", backward=True) == "block (backward)"
    copy_in = "copy_in_SLASHConstant_7_output_0_array"
    assert names.readable_state(copy_in, "Block") == "copy in Block · Constant_7 output (array)"
    # state fusion kept the copy's label on the state it merged the copy into
    assert names.readable_state(copy_in, backward=True, computes=True) == "block (backward)"
    assert names.readable_state("zero_accumulators") == "zero_accumulators"


def _top_level(sdfg: dace.SDFG) -> list[tuple[nodes.Node, dace.SDFGState]]:
    """The maps, tasklets, library nodes and nested SDFGs outside every map in ``sdfg``'s own states."""
    return [
        (n, s)
        for n, s in sdfg.all_nodes_recursive()
        if isinstance(n, (nodes.MapEntry, nodes.Tasklet, nodes.LibraryNode, nodes.NestedSDFG))
        and s.sdfg is sdfg
        and s.entry_node(n) is None
    ]


def test_what_expansions_make_reads_as_the_op_it_computes():
    # what auto_optimize leaves: the library nodes expanded, the expansions inlined, their maps fused
    forward = copy.deepcopy(_built("transformer").program.forward)
    forward.expand_library_nodes()
    forward.simplify()
    named = graph.named(forward)
    top = _top_level(forward)
    generic = [(n, s) for n, s in top if names.generic(graph.label(n))]
    assert len(generic) > 20
    # (the importer renames the result of the op that makes the module's output: what makes it is the output's)
    assert all(" · " in named[n].name or named[n].op == "output" for n, _ in generic), [named[n] for n, _ in generic]
    assert "output" in {named[n].op for n, _ in generic}  # norm2, the layer's last op
    einsums = {named[n].name for n, _ in generic if graph.label(n).startswith("einsum_")}
    assert {"linear1 · MatMul › einsum_gemmgemm", "self_attn · MatMul_1 › einsum_gemmbmm"} <= einsums
    # a LayerNorm's maps, its reductions' among them
    assert "norm1 · LayerNormalization" in {named[n].name for n, _ in generic if graph.label(n) == "reduce_output"}
    # a map's name is its ops', a tasklet's its op's and what it is where that says more; DaCe's stays in the details
    picture = graph.describe(forward)
    drawn = {n["guid"]: n for n in graph.all_nodes(picture)}
    for node, _ in generic:
        if " · " in named[node].name:
            assert drawn[node.guid]["info"]["DaCe name"] == graph.label(node)
    # an expansion's transient arrays read as the op of what writes them
    arrays = {n["label"]: n["name"] for n in graph.all_nodes(picture) if n["kind"] == graph.ACCESS}
    assert any(name.startswith("self_attn · Softmax › ") for name in arrays.values()), arrays


def test_what_autodiff_makes_reads_as_the_backward_of_the_op_it_reverses():
    backward = _built("transformer").program.backward
    named = graph.named(backward)
    reversed_ = [
        (n, s)
        for n, s in backward.all_nodes_recursive()
        if s.sdfg is backward and isinstance(n, nodes.Tasklet) and names.generic(n.label)
    ]
    assert len(reversed_) > 2 and all(n.label.endswith("_reverse_") for n, _ in reversed_)
    for node, state in reversed_:
        # the op whose output's gradient it reads
        (read,) = [e.data.data for e in state.in_edges(node) if e.data.data.startswith("gradient_")]
        assert named[node].op == f"{names.origin(read, 'TransformerEncoderLayer').op} (backward)"
    # the residual sums' backward is left only where it adds into src's gradient; its gradient is its branch's
    # (after_autodiff.shared_gradients), which it is named by (linear1's bias add has none left)
    assert "self_attn · Transpose_8 (backward) › Add" in {named[n].name for n, _ in reversed_}
    # what a backward rule holds, inside its nested SDFG, is of the rule's op
    (rule,) = [n for n, _ in _top_level(backward) if n.label == "SLASHnorm1SLASHLayerNormalization_backward"]
    inner = [named[n].name for n, _ in rule.sdfg.all_nodes_recursive() if isinstance(n, nodes.CodeNode)]
    assert len(inner) > 10 and all(name.startswith("norm1 · LayerNormalization (backward) › ") for name in inner)
    picture = graph.describe(backward)
    assert picture["states"][0]["label"] == "block (backward)"
