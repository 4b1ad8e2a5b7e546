"""The import of modules into DaCe (no compiles): what the exporter and importer are given and what comes back."""

import onnx
import pytest
import torch
from torch import nn

import dcnb
from dcnb._src.export_rules import HARDTANH
from dcnb._src.frontend import _expose_running_statistics, import_module
from tests.ops import Recurrent


def test_keyword_defaults_of_forward_are_not_exported_as_tensors():
    # the exporter appended is_causal=False to the inputs and the tracer made it a Tensor
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=12, dropout=0.0, batch_first=True).eval()
    imported = import_module(layer, (torch.randn(2, 3, 8),), training=False)
    assert imported.inputs == ["src"] and "self_attn.in_proj_weight" in imported.param_paths.values()


class _Unflatten(nn.Module):
    def forward(self, x):
        return x.unflatten(-1, (2, -1)).sum(-1)


def test_shape_arithmetic_folded_by_simplification_is_not_an_unsupported_op():
    # unflatten exports its shape arithmetic with Mod, which DaCe lacks but which simplification folds away
    imported = import_module(_Unflatten(), (torch.randn(3, 8),), training=False)
    assert "Mod" not in imported.ops and "ReduceSum" in imported.ops


def test_training_batch_norm_exposes_its_running_statistics():
    module = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3)).train()
    imported = import_module(module, (torch.randn(4, 2, 3, 3),), training=True)
    assert sorted(imported.buffer_updates.values()) == ["1.running_mean", "1.running_var"]
    assert imported.counters == ["1.num_batches_tracked"]
    assert len(imported.outputs) == 1 and not set(imported.outputs) & set(imported.buffer_updates)
    assert import_module(module.eval(), (torch.randn(4, 2, 3, 3),), training=False).buffer_updates == {}


def test_a_batch_norm_passed_alone_counts_its_own_batches():
    # its buffers have no module path in front: the counter was looked up as ".num_batches_tracked", never found,
    # and the naive step was refused (num_batches_tracked off by 1 from PyTorch's)
    imported = import_module(nn.BatchNorm2d(3).train(), (torch.randn(4, 3, 2, 2),), training=True)
    assert sorted(imported.buffer_updates.values()) == ["running_mean", "running_var"]
    assert imported.counters == ["num_batches_tracked"]


class _Last(nn.Module):
    def forward(self, x, i):
        return x[:, -1] + x[:, i]


def test_indices_from_the_end_are_moved_to_the_start_where_constant_and_at_run_time_otherwise():
    imported = import_module(_Last(), (torch.randn(2, 3), torch.tensor(1)), training=False)
    assert imported.ops.count("Gather") == 2 and imported.ops.count("Where") == 1  # only i's is left to run


def test_running_statistics_of_buffers_off_the_cpu():
    # a module on a GPU: its buffers refuse .numpy() (as tensors on PyTorch's meta device do, here without a GPU)
    module = nn.Sequential(nn.BatchNorm2d(3)).train().to("meta")
    names = ["x", "0.weight", "0.bias", "0.running_mean", "0.running_var"]
    node = onnx.helper.make_node("BatchNormalization", names, ["y", "mean", "var"], training_mode=1)
    value = lambda name: onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [2, 3, 1, 1])
    model = onnx.helper.make_model(onnx.helper.make_graph([node], "bn", [value("x")], [value("y")]))
    assert _expose_running_statistics(model, module) == {"mean": "0.running_mean", "var": "0.running_var"}
    assert [o.name for o in model.graph.output] == ["y", "mean", "var"]


def test_a_cumulative_batch_norm_in_training_names_the_module():
    module = nn.Sequential(nn.BatchNorm1d(3, momentum=None)).train()
    with pytest.raises(dcnb.UnsupportedOpError, match=r"0 is a BatchNorm with momentum=None") as raised:
        import_module(module, (torch.randn(4, 3),), training=True)
    assert raised.value.op == "BatchNormalization"


class _SliceFromARunTimeIndex(nn.Module):
    def forward(self, x, i):
        return x[i : i + 2] * 2


def test_an_op_its_implementation_does_not_cover_names_the_op_its_use_and_the_torch_call():
    # DaCe's Slice takes its bounds as constants only
    with pytest.raises(dcnb.UnsupportedOpError) as raised:
        import_module(_SliceFromARunTimeIndex(), (torch.randn(5, 3), torch.tensor(1)), training=False)
    message = str(raised.value)
    assert message.startswith("DaCe's implementation of the ONNX op Slice does not cover it as used here, which comes ")
    assert "`return x[i : i + 2] * 2` (test_frontend.py:" in message
    assert message.endswith("; _SliceFromARunTimeIndex cannot be built.")
    assert raised.value.op == "Slice"


def test_the_import_leaves_nothing_in_the_working_directory(tmp_path, monkeypatch):
    # onnxruntime's shape inference saves the model there when a shape escapes it (a Swin's shifted windows)
    from transformers import SwinConfig, SwinModel

    config = SwinConfig(image_size=16, patch_size=2, embed_dim=8, depths=[2], num_heads=[2], window_size=4)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("the user's")
    imported = import_module(SwinModel(config).eval(), (torch.randn(1, 3, 16, 16),), training=False)
    assert "Softmax" in imported.ops
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize(
    "rnn,steps,reason",
    [
        (nn.GRU(3, 2, num_layers=2, dropout=0.5), 4, "dropout between an RNN's layers in training mode"),
        (nn.LSTM(3, 2, bidirectional=True), 17, r"an RNN of 34 cell steps \(1 layers x 2 directions x 17 time steps\)"),
    ],
    ids=["dropout", "too long"],
)
def test_an_rnn_that_is_not_unrolled_is_refused_with_its_reason(rnn, steps, reason):
    with pytest.raises(dcnb.DcnbError, match=reason) as refused:
        import_module(Recurrent(rnn), (torch.randn(steps, 2, 3),), training=True)
    assert "TorchScript" not in str(refused.value) and "Caused by" not in str(refused.value)


def test_an_rnn_is_unrolled_into_standard_ops():
    imported = import_module(Recurrent(nn.LSTM(3, 2)), (torch.randn(4, 2, 3),), training=False)
    assert "LSTM" not in imported.ops and imported.ops.count("Sigmoid") == 3 * 4



class _Detached(nn.Module):
    def forward(self, x):
        return x - x.detach().mean()


def test_detach_is_imported_as_a_marked_identity_and_the_users_exports_stay_pytorchs(tmp_path):
    imported = import_module(_Detached(), (torch.randn(3, 4),), training=False)
    marked = [n for n, _ in imported.sdfg.all_nodes_recursive() if getattr(n, "backward_implementation", None)]
    assert [n.schema.name for n in marked] == ["Identity"] and "Identity" in imported.ops
    # dcnb's symbolic for detach holds during its own exports only
    torch.onnx.export(_Detached(), (torch.randn(3, 4),), tmp_path / "user.onnx", dynamo=False)
    assert [n.op_type for n in onnx.load(tmp_path / "user.onnx").graph.node] == ["ReduceMean", "Sub"]


class _Clipped(nn.Module):
    def forward(self, x):
        return nn.functional.relu6(x) + nn.functional.hardtanh(x, -0.5, 0.5) + x.clamp(0.0, 6.0)


def test_hardtanh_is_imported_as_a_marked_clip_beside_clamp_s_and_the_users_exports_stay_pytorchs(tmp_path):
    imported = import_module(_Clipped(), (torch.randn(3, 4),), training=False)
    clips = [n for n, _ in imported.sdfg.all_nodes_recursive() if getattr(n, "schema", None) and n.schema.name == "Clip"]
    assert sorted(str(n.backward_implementation) for n in clips) == ["None", HARDTANH, HARDTANH]
    # dcnb's symbolics for hardtanh and relu6 hold during its own exports only
    torch.onnx.export(_Clipped(), (torch.randn(3, 4),), tmp_path / "user.onnx", dynamo=False)
    ops = {(n.domain, n.op_type) for n in onnx.load(tmp_path / "user.onnx").graph.node}
    assert ops == {("", "Clip"), ("", "Add"), ("", "Constant")}
