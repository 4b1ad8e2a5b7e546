"""The Hugging Face model zoo: real architectures from ``transformers``, built from tiny configs with random
(seeded) weights. Nothing is downloaded: every model comes from its config class, whose defaults are replaced by
small sizes (hidden 32 or less, 2 heads, images of 32x32 or less, 1-2 layers or stages, a vocabulary of 64).

Used by tests/compile/test_hf_models.py (each entry built by dcnb and checked against PyTorch in eval and training
mode); notebooks/models.ipynb (the paper's model table in miniature) writes three of them out, to stand alone. Dropout is 0 everywhere, so that training
mode is deterministic; it then differs from eval mode where there is BatchNorm (batch statistics, running
statistics updated).

Whole models are called as they are (``model(pixel_values)`` returns transformers' ModelOutput, which dcnb
rebuilds); layers are called with the keyword inputs their model passes them (the attention mask, Llama's rotary
position embeddings) and attention is the eager one (``attn_implementation="eager"``: matrix products and a
softmax written out). PyTorch's ``scaled_dot_product_attention`` (``"sdpa"``) exports too with torch 2.13 (the BERT
layer with sdpa and its mask builds and checks in eval mode); eager keeps every operation visible in the graphs.

Also here, as in tests/zoo.py: MLP-Mixer, our own (transformers has none), two blocks with patch embedding and a
classifier head.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

#: what a builder returns: the module, its positional example inputs, its keyword example inputs
Built = tuple[nn.Module, tuple[torch.Tensor, ...], dict[str, Any]]

BOTH = (False, True)
EAGER = "eager"
#: tiny image models: 2 images of 3x32x32
IMAGE = (2, 3, 32, 32)
#: tiny sequence models: 2 sequences of 8 tokens, 32 features, 2 heads, feed-forward width 64, a vocabulary of 64
BATCH, TOKENS, HIDDEN, HEADS, FF, VOCAB = 2, 8, 32, 2, 64, 64


@dataclasses.dataclass(frozen=True)
class Model:
    """A catalog entry: how to build the module with its example inputs, and the modes to check it in."""

    name: str
    builder: Callable[[], Built]
    #: training flags to check
    modes: tuple[bool, ...] = BOTH
    #: what it is, in a few words (the notebook's table)
    description: str = ""

    def build(self, seed: int = 0) -> Built:
        """A fresh module with random (seeded) weights and statistics, its inputs and keyword inputs."""
        torch.manual_seed(seed)
        module, inputs, kwargs = self.builder()
        _randomize_statistics(module)
        return module, inputs, kwargs


def _randomize_statistics(module: nn.Module) -> None:
    """BatchNorm with running statistics and affine parameters away from their fresh values (0/1), as in zoo.py:
    eval mode must use the statistics, and the affine parameters' gradients must not be trivial."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                if m.running_mean is not None:
                    m.running_mean.copy_(0.1 * torch.randn_like(m.running_mean))
                    m.running_var.copy_(1 + 0.2 * torch.rand_like(m.running_var))
                if m.affine:
                    nn.init.normal_(m.weight, 1.0, 0.2)
                    nn.init.normal_(m.bias, 0.0, 0.2)


def _images(shape: tuple[int, ...] = IMAGE) -> tuple[torch.Tensor, ...]:
    return (torch.randn(*shape),)


# --- image models -------------------------------------------------------------------------------------------------


def resnet() -> Built:
    """ResNet: embedder (7x7 conv, BatchNorm, ReLU, max pool), two stages of basic blocks, pooler, classifier."""
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=5,
        downsample_in_first_stage=False,
    )
    return ResNetForImageClassification(config), _images(), {}


def mobilenet_v2() -> Built:
    """MobileNetV2: stem, inverted residuals (1x1 expand, 3x3 depthwise, 1x1 project, ReLU6), classifier."""
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    config = MobileNetV2Config(
        image_size=32, depth_multiplier=0.1, depth_divisible_by=4, min_depth=4, expand_ratio=2.0,
        finegrained_output=False, classifier_dropout_prob=0.0, num_labels=5,
    )
    model = MobileNetV2ForImageClassification(config)
    return _trim_mobilenet_v2(model), _images(), {}


def _trim_mobilenet_v2(model: nn.Module) -> nn.Module:
    """MobileNetV2's config fixes 16 inverted residuals; keep the first 3 (a strided one, one with a residual)."""
    layers = model.mobilenet_v2.layer
    model.mobilenet_v2.layer = nn.ModuleList(list(layers)[:3])
    last = model.mobilenet_v2.layer[-1].reduce_1x1.convolution.out_channels
    conv_1x1 = model.mobilenet_v2.conv_1x1
    conv_1x1.convolution = nn.Conv2d(last, conv_1x1.convolution.out_channels, 1, bias=False)
    return model


def efficientnet() -> Built:
    """EfficientNet: stem, MBConv blocks (expand, depthwise, squeeze-and-excitation, project, SiLU), head."""
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    config = EfficientNetConfig(
        image_size=32, width_coefficient=0.1, depth_coefficient=0.25, num_labels=5,
        kernel_sizes=[3, 3], in_channels=[32, 16], out_channels=[16, 24], depthwise_padding=[],
        strides=[1, 2], num_block_repeats=[1, 1], expand_ratios=[1, 6],
        hidden_dim=128, dropout_rate=0.0, drop_connect_rate=0.0,
    )
    return EfficientNetForImageClassification(config), _images(), {}


def vit() -> Built:
    """ViT: patch embedding (a strided conv), class token, position embeddings, 2 encoder layers, classifier."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=16, patch_size=4, num_channels=3, hidden_size=HIDDEN, num_hidden_layers=2,
        num_attention_heads=HEADS, intermediate_size=FF, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        num_labels=5, attn_implementation=EAGER,
    )
    return ViTForImageClassification(config), _images((2, 3, 16, 16)), {}


def convnext() -> Built:
    """ConvNeXt: patchify stem, blocks (7x7 depthwise conv, LayerNorm, MLP with GELU, layer scale), 2 stages."""
    from transformers import ConvNextConfig, ConvNextForImageClassification

    config = ConvNextConfig(
        num_channels=3, patch_size=4, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5, drop_path_rate=0.0,
        image_size=32,
    )
    model = ConvNextForImageClassification(config)
    with torch.no_grad():  # layer scale starts at 1e-6: the blocks' branches would add nothing to check
        for name, p in model.named_parameters():
            if name.endswith("layer_scale_parameter"):
                p.copy_(0.5 + 0.1 * torch.randn_like(p))
    return model, _images(), {}


# --- transformer layers ------------------------------------------------------------------------------------------


def _bert_config():
    from transformers import BertConfig

    return BertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=HEADS, intermediate_size=FF,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=32,
        attn_implementation=EAGER,
    )


def _extended_mask(mask: torch.Tensor) -> torch.Tensor:
    """BERT's additive attention mask from a 0/1 padding mask: 0 where attended, the dtype's minimum elsewhere."""
    return (1.0 - mask[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min


def _padding_mask() -> torch.Tensor:
    mask = torch.ones(BATCH, TOKENS, dtype=torch.long)
    mask[1, -3:] = 0  # the second sequence is padded
    return mask


def bert_layer() -> Built:
    """BERT's encoder layer (self-attention, residual + LayerNorm, GELU MLP, residual + LayerNorm) with a mask."""
    from transformers.models.bert.modeling_bert import BertLayer

    layer = BertLayer(_bert_config())
    return layer, (torch.randn(BATCH, TOKENS, HIDDEN),), {"attention_mask": _extended_mask(_padding_mask())}


class BertEncoder2(nn.Module):
    """A 2-layer BERT encoder from token ids: embeddings (words, positions, token types, LayerNorm), the encoder
    layers with the padding mask made additive inside, the pooler. Returns BertModel's ModelOutput."""

    def __init__(self):
        super().__init__()
        from transformers import BertModel

        self.bert = BertModel(_bert_config(), add_pooling_layer=True)

    def forward(self, input_ids, attention_mask):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask)


def bert_encoder() -> Built:
    ids = torch.randint(1, VOCAB, (BATCH, TOKENS))
    return BertEncoder2(), (ids,), {"attention_mask": _padding_mask()}


def gpt2_block() -> Built:
    """GPT-2's block: LayerNorm, causal self-attention (Conv1D projections), LayerNorm, MLP with GELU (tanh)."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    config = GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=HIDDEN, n_layer=1, n_head=HEADS, n_inner=FF, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, attn_implementation=EAGER,
    )
    return GPT2Block(config, layer_idx=0), (torch.randn(BATCH, TOKENS, HIDDEN),), {}


class LlamaLayer(nn.Module):
    """Llama's decoder layer with its rotary embeddings: RMSNorm, attention with rotary position embeddings (cos,
    sin from LlamaRotaryEmbedding, as LlamaModel computes them) and a causal mask, RMSNorm, SwiGLU MLP."""

    def __init__(self):
        super().__init__()
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        config = LlamaConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FF, num_hidden_layers=1,
            num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=32, attention_dropout=0.0,
            attn_implementation=EAGER,
        )
        self.rotary = LlamaRotaryEmbedding(config)
        self.layer = LlamaDecoderLayer(config, layer_idx=0)
        with torch.no_grad():  # RMSNorm's weights start at 1: make their gradients say something
            for name, p in self.layer.named_parameters():
                if name.endswith("layernorm.weight"):
                    p.copy_(1 + 0.2 * torch.randn_like(p))
        causal = torch.full((TOKENS, TOKENS), torch.finfo(torch.float32).min).triu(1)
        self.register_buffer("causal", causal[None, None], persistent=False)

    def forward(self, hidden_states, position_ids):
        position_embeddings = self.rotary(hidden_states, position_ids)
        return self.layer(
            hidden_states, attention_mask=self.causal, position_ids=position_ids,
            position_embeddings=position_embeddings,
        )


def llama_layer() -> Built:
    positions = torch.arange(TOKENS)[None].expand(BATCH, TOKENS).contiguous()
    return LlamaLayer(), (torch.randn(BATCH, TOKENS, HIDDEN),), {"position_ids": positions}


def bart_with_labels() -> Built:
    """BART for generation, its loss from labels: a shared embedding with a padding row, tied to the output layer,
    and decoder ids shifted right by slice assignment. Not in the catalog (nor the speed table): a test of its own."""
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(
        vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=1, decoder_layers=1, encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS, encoder_ffn_dim=FF, decoder_ffn_dim=FF, max_position_embeddings=32,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1, decoder_start_token_id=2,
    )
    ids = torch.randint(1, VOCAB, (BATCH, TOKENS))
    return BartForConditionalGeneration(config), (ids,), {"labels": torch.randint(1, VOCAB, (BATCH, TOKENS))}


# --- MLP-Mixer, our own -------------------------------------------------------------------------------------------


class Mixer(nn.Module):
    """MLP-Mixer: patch embedding (a strided conv), 2 mixer blocks (tests/zoo.py's), LayerNorm, mean over patches,
    classifier."""

    def __init__(self, patch: int = 4, image: int = 16, dim: int = 16, hidden: int = 24, depth: int = 2,
                 classes: int = 5):
        super().__init__()
        from tests.zoo import MixerBlock

        patches = (image // patch) ** 2
        self.stem = nn.Conv2d(3, dim, patch, stride=patch)
        self.blocks = nn.Sequential(*(MixerBlock(patches, dim, hidden) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(dim=1))


def mixer() -> Built:
    return Mixer(), _images((2, 3, 16, 16)), {}


# --- the catalog --------------------------------------------------------------------------------------------------

MODELS: list[Model] = [
    Model("resnet", resnet, description="ResNet, 2 stages of basic blocks"),
    Model("mobilenet_v2", mobilenet_v2, description="MobileNetV2, 3 inverted residuals"),
    Model("efficientnet", efficientnet, description="EfficientNet, 2 MBConv blocks"),
    Model("vit", vit, description="ViT, 2 layers, 16 patches"),
    Model("convnext", convnext, description="ConvNeXt, 2 stages"),
    Model("bert_layer", bert_layer, description="a BERT encoder layer with a padding mask"),
    Model("bert_encoder", bert_encoder, description="a 2-layer BERT encoder from token ids, with the pooler"),
    Model("gpt2_block", gpt2_block, description="a GPT-2 block"),
    Model("llama_layer", llama_layer, description="a Llama decoder layer (RMSNorm, rotary embeddings, SwiGLU)"),
    Model("mixer", mixer, description="MLP-Mixer, 2 blocks (ours)"),
]

BY_NAME = {model.name: model for model in MODELS}


# --- the same architectures at the sizes people train them at (issue 36) -------------------------------------------
#
# benchmarks/models.py --size full runs these: the configs of the published models (ResNet-50, EfficientNet-B0,
# MobileNetV2 1.0/224, ConvNeXt-T, ViT-B/16, BERT-base, GPT-2 small) with random weights, at the batch sizes the
# issue asks for. transformers has no MobileNetV3 (5.23): MobileNetV2 stands in. Dropout and stochastic depth are 0,
# as above; each entry bears its test-size namesake's name (``resnet`` is ResNet-50 here). The batch can be scaled
# down, and the transformer stacks' depth (``layers``), where 2 cores would not finish a run.

#: the classifiers' classes (ImageNet's), and BERT-base's and GPT-2 small's widths
CLASSES, BASE_HIDDEN, BASE_HEADS, BASE_FF = 1000, 768, 12, 3072


@dataclasses.dataclass(frozen=True)
class FullModel:
    """A full-size entry: ``builder(batch, layers)`` builds the module at ``batch`` (and, for a stack of layers, with
    ``layers`` of them) with its example inputs; ``example`` is one example's input shape."""

    name: str
    architecture: str
    builder: Callable[[int, int | None], Built]
    #: the batch the issue asks for
    batch: int
    #: one example's input shape (an image's channels and pixels, a sequence's tokens and features)
    example: tuple[int, ...]
    #: the stack's depth at full size, where it can be scaled (transformer layers); None: fixed
    layers: int | None = None

    def shape(self, batch: int | None = None) -> tuple[int, ...]:
        """The first input's shape at ``batch`` (the issue's batch by default)."""
        return (self.batch if batch is None else batch, *self.example)

    def size(self, batch: int | None = None, layers: int | None = None) -> str:
        """What a run at ``batch`` and ``layers`` is, in words: ``ResNet-50, 8x3x224x224``, with the depth where it
        was scaled down (``BERT-base encoder, 4 of 12 layers, 8x128``)."""
        depth = f", {layers} of {self.layers} layers" if layers is not None and layers != self.layers else ""
        return f"{self.architecture}{depth}, {'x'.join(map(str, self.shape(batch)))}"

    def build(self, seed: int = 0, batch: int | None = None, layers: int | None = None) -> Built:
        """A fresh module with random (seeded) weights and statistics at ``batch`` (default: the issue's) and
        ``layers`` (default: the full depth; refused where the depth is fixed)."""
        if layers is not None and self.layers is None:
            raise ValueError(f"{self.architecture}'s depth is fixed: no layers={layers}")
        torch.manual_seed(seed)
        module, inputs, kwargs = self.builder(self.batch if batch is None else batch, layers or self.layers)
        _randomize_statistics(module)
        return module, inputs, kwargs


def resnet50(batch: int, layers: int | None = None) -> Built:
    """ResNet-50: bottleneck blocks 3-4-6-3, widths 256-2048, 1000 classes (25.6 M parameters)."""
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(
        embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3], layer_type="bottleneck",
        num_labels=CLASSES,
    )
    return ResNetForImageClassification(config), _images((batch, 3, 224, 224)), {}


def efficientnet_b0(batch: int, layers: int | None = None) -> Built:
    """EfficientNet-B0: width and depth coefficients 1.0, 224x224, head 1280 (5.3 M parameters)."""
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    config = EfficientNetConfig(
        image_size=224, width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280, dropout_rate=0.0,
        drop_connect_rate=0.0, num_labels=CLASSES,
    )
    return EfficientNetForImageClassification(config), _images((batch, 3, 224, 224)), {}


def mobilenet_v2_full(batch: int, layers: int | None = None) -> Built:
    """MobileNetV2 1.0/224: all 16 inverted residuals (3.5 M parameters)."""
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    config = MobileNetV2Config(image_size=224, depth_multiplier=1.0, classifier_dropout_prob=0.0, num_labels=CLASSES)
    return MobileNetV2ForImageClassification(config), _images((batch, 3, 224, 224)), {}


def convnext_tiny(batch: int, layers: int | None = None) -> Built:
    """ConvNeXt-T: depths 3-3-9-3, widths 96-768, layer scale at its initial 1e-6 (28.6 M parameters)."""
    from transformers import ConvNextConfig, ConvNextForImageClassification

    config = ConvNextConfig(
        depths=[3, 3, 9, 3], hidden_sizes=[96, 192, 384, 768], image_size=224, drop_path_rate=0.0, num_labels=CLASSES
    )
    return ConvNextForImageClassification(config), _images((batch, 3, 224, 224)), {}


def vit_base(batch: int, layers: int | None = 12) -> Built:
    """ViT-B/16: 224x224 in 16x16 patches (196 and the class token), 12 layers of 768, 12 heads (86.6 M parameters)."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=224, patch_size=16, hidden_size=BASE_HIDDEN, num_hidden_layers=layers,
        num_attention_heads=BASE_HEADS, intermediate_size=BASE_FF, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=CLASSES, attn_implementation=EAGER,
    )
    return ViTForImageClassification(config), _images((batch, 3, 224, 224)), {}


def _bert_base_config(layers: int = 12):
    from transformers import BertConfig

    return BertConfig(
        hidden_size=BASE_HIDDEN, num_hidden_layers=layers, num_attention_heads=BASE_HEADS, intermediate_size=BASE_FF,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation=EAGER,
    )


def _padding_mask_of(batch: int, tokens: int) -> torch.Tensor:
    mask = torch.ones(batch, tokens, dtype=torch.long)
    mask[-1, -tokens // 4:] = 0  # the last sequence is padded by a quarter
    return mask


def bert_base_layer(batch: int, layers: int | None = None) -> Built:
    """One BERT-base encoder layer (768, 12 heads, feed-forward 3072) on 128-token sequences, with a padding mask."""
    from transformers.models.bert.modeling_bert import BertLayer

    mask = _extended_mask(_padding_mask_of(batch, 128))
    return BertLayer(_bert_base_config()), (torch.randn(batch, 128, BASE_HIDDEN),), {"attention_mask": mask}


class BertBase(nn.Module):
    """BERT-base from token ids (BertEncoder2 at full size): embeddings (a vocabulary of 30522), ``layers`` encoder
    layers, the pooler; BertModel's ModelOutput."""

    def __init__(self, layers: int = 12):
        super().__init__()
        from transformers import BertModel

        self.bert = BertModel(_bert_base_config(layers), add_pooling_layer=True)

    def forward(self, input_ids, attention_mask):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask)


def bert_base_encoder(batch: int, layers: int | None = 12) -> Built:
    """BERT-base's encoder from token ids, 12 layers (110 M parameters), 128-token sequences, a padding mask."""
    ids = torch.randint(1, 30522, (batch, 128))
    return BertBase(layers), (ids,), {"attention_mask": _padding_mask_of(batch, 128)}


def gpt2_small_block(batch: int, layers: int | None = None) -> Built:
    """One GPT-2 small block (768, 12 heads, MLP 3072, causal) on 128-token sequences."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    config = GPT2Config(
        n_embd=BASE_HIDDEN, n_layer=12, n_head=BASE_HEADS, n_inner=BASE_FF, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, attn_implementation=EAGER,
    )
    return GPT2Block(config, layer_idx=0), (torch.randn(batch, 128, BASE_HIDDEN),), {}


#: the full sizes, cheapest first (the order benchmarks/models.py --size full runs them in)
FULL: list[FullModel] = [
    FullModel("gpt2_block", "GPT-2 small block", gpt2_small_block, 8, (128, BASE_HIDDEN)),
    FullModel("bert_layer", "BERT-base layer", bert_base_layer, 8, (128, BASE_HIDDEN)),
    FullModel("resnet", "ResNet-50", resnet50, 8, (3, 224, 224)),
    FullModel("mobilenet_v2", "MobileNetV2 1.0/224", mobilenet_v2_full, 8, (3, 224, 224)),
    FullModel("efficientnet", "EfficientNet-B0", efficientnet_b0, 8, (3, 224, 224)),
    FullModel("convnext", "ConvNeXt-T", convnext_tiny, 8, (3, 224, 224)),
    FullModel("vit", "ViT-B/16", vit_base, 8, (3, 224, 224), layers=12),
    FullModel("bert_encoder", "BERT-base encoder", bert_base_encoder, 8, (128,), layers=12),
]

FULL_BY_NAME = {model.name: model for model in FULL}
