"""``benchmarks/models.py --size full`` lists the models issue 36 asks for at the sizes people train them at, with
the shapes it asks for: each entry of tests/hf_models.py's FULL built on the meta device (no memory, no compile),
its config and inputs checked."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest
import torch

from tests.hf_models import FULL, FULL_BY_NAME

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: name -> (architecture, the first input's shape at the issue's batch of 8)
ASKED = {
    "gpt2_block": ("GPT-2 small block", (8, 128, 768)),
    "bert_layer": ("BERT-base layer", (8, 128, 768)),
    "resnet": ("ResNet-50", (8, 3, 224, 224)),
    "mobilenet_v2": ("MobileNetV2 1.0/224", (8, 3, 224, 224)),
    "efficientnet": ("EfficientNet-B0", (8, 3, 224, 224)),
    "convnext": ("ConvNeXt-T", (8, 3, 224, 224)),
    "vit": ("ViT-B/16", (8, 3, 224, 224)),
    "bert_encoder": ("BERT-base encoder", (8, 128)),
}


def _models_py():
    # the benchmarks import their shared module (common.py) from their own folder, as a script's does
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.append(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("benchmarks_models", ROOT / "benchmarks" / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_listing_has_every_asked_model_at_its_shape():
    listed = {entry["model"]: entry for entry in _models_py().listing("full")}
    assert set(listed) == set(ASKED)
    for name, (architecture, shape) in ASKED.items():
        assert listed[name]["shape"] == list(shape), name
        assert listed[name]["size"] == f"{architecture}, {'x'.join(map(str, shape))}"
    # the test sizes are still there, under the same names
    assert {entry["model"] for entry in _models_py().listing("test")} >= set(ASKED)


def _config(module: torch.nn.Module):
    return getattr(module, "config", None) or next(m.config for m in module.modules() if hasattr(m, "config"))


@pytest.mark.parametrize("entry", FULL, ids=lambda e: e.name)
def test_built_at_the_listed_shape_and_config(entry):
    with torch.device("meta"):
        module, inputs, kwargs = entry.build()
    assert tuple(inputs[0].shape) == ASKED[entry.name][1] == entry.shape()
    config = _config(module)
    if entry.name == "resnet":
        assert (config.depths, config.layer_type) == ([3, 4, 6, 3], "bottleneck")
        assert config.hidden_sizes == [256, 512, 1024, 2048]
    elif entry.name == "efficientnet":
        assert (config.width_coefficient, config.depth_coefficient, config.image_size) == (1.0, 1.0, 224)
    elif entry.name == "convnext":
        assert (config.depths, config.hidden_sizes) == ([3, 3, 9, 3], [96, 192, 384, 768])
    elif entry.name == "mobilenet_v2":
        assert (config.depth_multiplier, config.image_size) == (1.0, 224)
    elif entry.name == "vit":
        assert (config.image_size, config.patch_size, config.num_hidden_layers) == (224, 16, 12)
    else:  # BERT-base and GPT-2 small: 768 wide, 12 heads, feed-forward 3072
        hidden = getattr(config, "hidden_size", None) or config.n_embd
        heads = getattr(config, "num_attention_heads", None) or config.n_head
        inner = getattr(config, "intermediate_size", None) or config.n_inner
        assert (hidden, heads, inner) == (768, 12, 3072)
    if entry.name in ("vit", "bert_encoder"):
        assert config.num_hidden_layers == entry.layers == 12
    if entry.name in ("bert_layer", "bert_encoder"):
        mask = kwargs["attention_mask"].shape
        assert (mask[0], mask[-1]) == (8, 128)


def test_scaled_down_runs_say_so():
    assert FULL_BY_NAME["bert_encoder"].size(batch=2, layers=4) == "BERT-base encoder, 4 of 12 layers, 2x128"
    assert FULL_BY_NAME["resnet"].size(batch=1) == "ResNet-50, 1x3x224x224"
    with torch.device("meta"):
        module, inputs, _ = FULL_BY_NAME["vit"].build(batch=2, layers=3)
    assert tuple(inputs[0].shape) == (2, 3, 224, 224) and _config(module).num_hidden_layers == 3
    with pytest.raises(ValueError, match="fixed"):
        FULL_BY_NAME["resnet"].build(layers=2)


def test_full_table_says_what_ran_and_what_did_not_finish():
    rows = [
        {
            "model": "gpt2_block", "size": "GPT-2 small block, 8x128x768", "torch_ms": 200.0, "torch_compile_ms": 190.0,
            "naive_ok": True, "naive_step_s": 40.0, "naive_vs_torch": 1.2, "naive_vs_torch_compile": 1.3,
            "auto_optimize_ok": True, "auto_optimize_step_s": 50.0, "auto_optimize_vs_torch": 1.1,
            "auto_optimize_vs_torch_compile": 1.2, "auto_optimize_noise": True, "load_start": 2.0, "load_end": 2.5,
            "date": "2026-11-27 00:00 UTC",
        },
        {"model": "resnet", "size": "ResNet-50, 1x3x224x224", "unfinished": "stopped after 900 s", "load_start": 3.0},
    ]
    table = _models_py()._markdown_full(rows).splitlines()
    assert len(table) == 4
    assert "| 1.20 / 1.30 | 1.10 / 1.20 (noise) | not run |" in table[2]
    assert "40.0 / 50.0 / - / -" in table[2] and "2.0, 2.5" in table[2]
    assert "ResNet-50, 1x3x224x224" in table[3] and "stopped after 900 s" in table[3]
