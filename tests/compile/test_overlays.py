"""Static metrics of a compiled step's nodes (the graph's overlays): bytes moved, FLOPs, arithmetic intensity, on
real builds of Mish, the zoo's MLP and its transformer layer."""

import json
import math

import pytest
import torch
from dace.sdfg import nodes
from tests.models import Mish
from tests.zoo import CASES

import dcnb
from dcnb._src.views import overlays

pytestmark = pytest.mark.compile

SHAPE = (2, 3, 8, 8)
ELEMENTS = math.prod(SHAPE)


def _by_label(sdfg, kind: type) -> dict[str, nodes.Node]:
    return {n.label: n for n, _ in sdfg.all_nodes_recursive() if isinstance(n, kind)}


def test_mish_maps_count_their_arithmetic_and_their_traffic():
    session = dcnb.optimize(Mish(), torch.rand(*SHAPE), baselines=(), time_budget=0.0)
    found = overlays.of(session)
    json.dumps(found)  # plain data, as the widget sends it
    forward = _by_label(session.forward_sdfg, nodes.MapEntry)
    metrics = found["forward"]
    # one exp per element; read x, write exp(x): 4 bytes each
    exp = metrics[forward["_numpy_exp__map"].guid]
    assert exp == {"flops": ELEMENTS, "bytes": 2 * 4 * ELEMENTS, "intensity": 1 / 8}
    # x * tanh(...) reads two arrays
    assert metrics[forward["_Mult__map"].guid]["bytes"] == 3 * 4 * ELEMENTS
    # a tasklet counts for every iteration of its map; a map's exit shows the map's
    tasklet = _by_label(session.forward_sdfg, nodes.Tasklet)["_numpy_exp_"]
    assert metrics[tasklet.guid] == exp
    (exit_node,) = [n for n, _ in session.forward_sdfg.all_nodes_recursive() if isinstance(n, nodes.MapExit)
                    and n.map is forward["_numpy_exp__map"].map]
    assert metrics[exit_node.guid] == exp

    # fused before autodiff: one tasklet, x * tanh(log(1 + exp(x))), five operations on one read and one write
    assert session.apply("tasklet_fusion").ok
    fused = overlays.of(session)["forward"]
    (entry,) = _by_label(session.forward_sdfg, nodes.MapEntry).values()
    assert fused[entry.guid] == {"flops": 5 * ELEMENTS, "bytes": 8 * ELEMENTS, "intensity": 5 / 8}
    # vectorized: the tasklet does its code on 8 lanes at once, an eighth as often; the counts stay
    assert session.apply("vectorization").ok
    (vectorized,) = _by_label(session.forward_sdfg, nodes.MapEntry).values()
    assert overlays.of(session)["forward"][vectorized.guid] == fused[entry.guid]


def test_a_matrix_product_counts_2mnk():
    # the MLP's Linear layers are Einsums (DaCe's analysis has no formula for ONNX nodes); the rest of its library
    # nodes (LayerNorm) count through their expansion
    module, inputs = CASES["mlp"].build()
    session = dcnb.optimize(module, *inputs, baselines=(), time_budget=0.0)
    metrics = overlays.of(session)["forward"]
    libraries = _by_label(session.forward_sdfg, nodes.LibraryNode)
    batch, width, classes = inputs[0].shape[0], module.fc1.in_features, module.fc2.out_features
    fc1 = metrics[libraries["SLASHfc1SLASHGemm_einsum_expansion"].guid]
    assert fc1["flops"] == 2 * batch * width * width
    # reads x and the weight, writes the product
    assert fc1["bytes"] == 4 * (batch * width + width * width + batch * width)
    assert fc1["intensity"] == fc1["flops"] / fc1["bytes"]
    assert metrics[libraries["SLASHfc2SLASHGemm_einsum_expansion"].guid]["flops"] == 2 * batch * width * classes
    norm = metrics[libraries["SLASHnormSLASHLayerNormalization"].guid]
    assert norm["flops"] > 5 * batch * width  # (mean, variance, normalize, scale and shift, at the least)
    # the loss's expansion is C++: its work is unknown, its traffic is not
    loss = metrics[libraries["SLASHSoftmaxCrossEntropyLoss"].guid]
    assert "flops" not in loss and "intensity" not in loss and loss["bytes"] > 0


def test_every_map_and_library_node_of_the_transformer_layer_has_its_metrics(transformer_session):
    session = transformer_session
    module, inputs = CASES["transformer"].build()  # (the session's: its shapes, its heads)
    found = overlays.of(session)
    for sdfg, metrics in zip(session.compiled_sdfgs(), (found["forward"], found["backward"])):
        for node, _ in sdfg.all_nodes_recursive():
            if isinstance(node, (nodes.MapEntry, nodes.LibraryNode)):
                assert {"bytes", "flops"} <= set(metrics.get(node.guid, {})), (sdfg.name, node.label)
    # attention's scores: heads x (queries x keys) dot products of the head width, for each sequence
    (batch, length, width), heads = inputs[0].shape, module.self_attn.num_heads
    scores = _by_label(session.forward_sdfg, nodes.LibraryNode)["SLASHself_attnSLASHMatMul_1_einsum_expansion"]
    assert found["forward"][scores.guid]["flops"] == 2 * batch * heads * length * length * (width // heads)
