"""The op catalog: one tiny module per op that common models use, with example inputs.

tests/compile/test_ops.py builds each through dcnb, forward and backward, and compares with PyTorch eager within the
zoo's tolerance. Each entry's inputs are drawn from a seeded generator, so a failure reproduces.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class Fn(nn.Module):
    """A function of the inputs as a module (``Fn(torch.abs)``): most ops need no parameters."""

    def __init__(self, fn: Callable[..., torch.Tensor]):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    module: Callable[[], nn.Module]
    inputs: Callable[[torch.Generator], tuple[torch.Tensor, ...]]

    def build(self) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(0)
        return self.module(), self.inputs(gen)


def randn(*shape: int) -> Callable[[torch.Generator], tuple[torch.Tensor, ...]]:
    return lambda gen: (torch.randn(*shape, generator=gen),)


def away_from_zero(*shape: int) -> Callable[[torch.Generator], tuple[torch.Tensor, ...]]:
    """Values at least 0.1 from 0, where derivatives of |x|, sign and comparisons jump."""
    def draw(gen):
        x = torch.randn(*shape, generator=gen)
        return (x + 0.1 * torch.sign(x),)
    return draw


def at_bounds(*bounds: float) -> Callable[[torch.Generator], tuple[torch.Tensor, ...]]:
    """Values around ``bounds`` with each bound itself in two places: where a clip's or a kink's gradient passes or
    stops as PyTorch's does (clamp's passes at its bounds, hardtanh's stops)."""
    def draw(gen):
        x = (max(abs(b) for b in bounds) + 1) * torch.randn(4, 8, generator=gen)
        x[:2, : len(bounds)] = torch.tensor(bounds)
        return (x,)
    return draw


def two(*shape: int) -> Callable[[torch.Generator], tuple[torch.Tensor, ...]]:
    return lambda gen: (torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen))


def distinct(*shape: int) -> Callable[[torch.Generator], tuple[torch.Tensor, ...]]:
    """A permutation of well-separated values: maxima and sorts have one answer and a gradient at one place."""
    def draw(gen):
        n = 1
        for s in shape:
            n *= s
        return ((torch.randperm(n, generator=gen).float() / n).reshape(shape),)
    return draw


def _labels(gen, n: int, classes: int) -> torch.Tensor:
    return torch.randint(0, classes, (n,), generator=gen)


class Attention(nn.Module):
    """scaled_dot_product_attention over (batch, heads, sequence, dim), causal or with a boolean mask."""

    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v):
        if self.causal:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class MultiheadAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class Loss(nn.Module):
    """A loss of the input and targets drawn with it."""

    def __init__(self, fn: Callable[..., torch.Tensor]):
        super().__init__()
        self.fn = fn

    def forward(self, x, target):
        return self.fn(x, target)


def _classes(gen):
    return torch.randn(6, 5, generator=gen), _labels(gen, 6, 5)


def _same_shape(gen):
    return torch.randn(6, 5, generator=gen), torch.randn(6, 5, generator=gen)


def _probabilities(gen):
    return torch.randn(6, 5, generator=gen), torch.rand(6, 5, generator=gen)


def _log_probabilities(gen):
    return torch.randn(6, 5, generator=gen).log_softmax(-1), _labels(gen, 6, 5)


def _qkv(gen):
    return tuple(torch.randn(2, 2, 6, 8, generator=gen) for _ in range(3))


def _embedding_ids(gen):
    return (torch.randint(0, 10, (3, 5), generator=gen),)


def _addmm(*bias: int) -> Callable[[torch.Generator], tuple[torch.Tensor, ...]]:
    """A bias of shape ``bias`` and the two factors of a 3 x 5 product."""
    return lambda gen: (torch.randn(*bias, generator=gen), torch.randn(3, 4, generator=gen), torch.randn(4, 5, generator=gen))


def double(*shape: int) -> Callable[[torch.Generator], tuple[torch.Tensor, ...]]:
    return lambda gen: (torch.randn(*shape, generator=gen, dtype=torch.float64),)


def with_zeros(*shape: int) -> Callable[[torch.Generator], tuple[torch.Tensor, ...]]:
    """Values with a zero in some places, once or twice along the last axis: a product's gradient divides by none."""
    def draw(gen):
        x = torch.randn(*shape, generator=gen)
        x[..., 0, 1] = 0
        x[..., 1, 0] = x[..., 1, 2] = 0
        return (x,)
    return draw


class _L1Normalized(nn.Module):
    """A product with a weight whose columns are scaled to an L1 norm of 1 (LpNormalization with p=1)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 6))

    def forward(self, x):
        return x @ (self.weight / self.weight.norm(p=1, dim=0, keepdim=True)).t()


class _ClampedScale(nn.Module):
    """A learned scale clamped from above (Swin V2's logit scale): Clip with a max and no min."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([[0.2], [0.9], [-0.3]]))

    def forward(self, x):
        return x * torch.clamp(self.scale, max=0.5).exp()


def _shifted_right(x, start):
    """A new tensor assigned in slices (T5's and BART's decoder inputs, here of floats)."""
    shifted = x.new_zeros(x.shape)
    shifted[:, 1:] = x[:, :-1]
    shifted[:, 0] = start[:, 0]
    return shifted * 2


def _padded_product(x, w):
    """A product of a slice padded back by computed sizes, whose shape the exporter does not know (Funnel's pooled
    attention)."""
    n = x.shape[1]
    y = x[:, : (n + 1) // 2]
    y = F.pad(y, (0, 0, 0, n - y.shape[1]))
    return torch.einsum("bid,jd->bij", y, w)


def _eval_batch_norm(features: int) -> nn.Module:
    """An eval-mode BatchNorm with running statistics of their own (the defaults, 0 and 1, would normalize nothing)."""
    norm = nn.BatchNorm1d(features)
    norm.running_mean.uniform_(-1, 1)
    norm.running_var.uniform_(0.5, 2)
    return norm.eval()


def _classes_3d(gen):
    return torch.randn(3, 5, 4, generator=gen).log_softmax(1), torch.randint(0, 5, (3, 4), generator=gen)


ACTIVATIONS = [
    Op("relu", lambda: nn.ReLU(), at_bounds(0.0)),
    Op("elu", lambda: nn.ELU(), randn(4, 8)),
    Op("elu_alpha", lambda: nn.ELU(alpha=0.5), randn(4, 8)),
    Op("selu", lambda: nn.SELU(), randn(4, 8)),
    Op("celu", lambda: nn.CELU(alpha=2.0), randn(4, 8)),
    Op("leaky_relu", lambda: nn.LeakyReLU(0.2), at_bounds(0.0)),
    Op("prelu", lambda: nn.PReLU(), away_from_zero(4, 8)),
    Op("prelu_channels", lambda: nn.PReLU(3), away_from_zero(2, 3, 4, 4)),
    Op("softplus_beta", lambda: nn.Softplus(beta=2.0), randn(4, 8)),
    Op("softsign", lambda: nn.Softsign(), randn(4, 8)),
    Op("logsigmoid", lambda: nn.LogSigmoid(), randn(4, 8)),
    Op("glu", lambda: nn.GLU(dim=-1), randn(4, 8)),
    Op("hardtanh", lambda: nn.Hardtanh(-0.5, 0.5), at_bounds(-0.5, 0.5)),
    Op("relu6", lambda: nn.ReLU6(), at_bounds(0.0, 6.0)),
    Op("relu6_functional", lambda: Fn(F.relu6), at_bounds(0.0, 6.0)),
    Op(
        "hardtanh_beside_clamp",
        lambda: Fn(lambda x: F.hardtanh(x, -0.5, 0.5) + x.clamp(-0.5, 0.5) * x),
        at_bounds(-0.5, 0.5),
    ),
    Op("mish", lambda: nn.Mish(), randn(4, 8)),
    Op("gelu", lambda: nn.GELU(), randn(4, 8)),
    Op("gelu_tanh", lambda: nn.GELU(approximate="tanh"), randn(4, 8)),
    Op("silu", lambda: nn.SiLU(), randn(4, 8)),
    Op("sigmoid", lambda: nn.Sigmoid(), randn(4, 8)),
    Op("tanh", lambda: nn.Tanh(), randn(4, 8)),
    Op("hardsigmoid", lambda: nn.Hardsigmoid(), at_bounds(-3.0, 3.0)),
    Op("hardswish", lambda: nn.Hardswish(), at_bounds(-3.0, 3.0)),
    Op("softmin", lambda: nn.Softmin(dim=-1), randn(4, 8)),
    Op("log_softmax", lambda: nn.LogSoftmax(dim=1), randn(4, 8)),
    Op("softmax_channels", lambda: nn.Softmax2d(), randn(2, 3, 4, 4)),
    Op("log_softmax_first_axis", lambda: nn.LogSoftmax(dim=0), randn(3, 2, 4)),
    Op("threshold", lambda: nn.Threshold(0.1, -1.0), away_from_zero(4, 8)),
    Op("tanhshrink", lambda: nn.Tanhshrink(), randn(4, 8)),
]

ELEMENTWISE = [
    Op("abs", lambda: Fn(torch.abs), away_from_zero(4, 8)),
    Op("neg", lambda: Fn(torch.neg), randn(4, 8)),
    Op("sign", lambda: Fn(lambda x: x * torch.sign(x)), away_from_zero(4, 8)),
    Op("reciprocal", lambda: Fn(torch.reciprocal), away_from_zero(4, 8)),
    Op("exp_log", lambda: Fn(lambda x: torch.log(torch.exp(x) + 1)), randn(4, 8)),
    Op("sqrt_rsqrt", lambda: Fn(lambda x: torch.sqrt(x.abs() + 1) + torch.rsqrt(x * x + 1)), randn(4, 8)),
    Op("pow", lambda: Fn(lambda x: x.pow(3) + (x * x + 1).pow(0.5)), randn(4, 8)),
    Op("trig", lambda: Fn(lambda x: torch.sin(x) * torch.cos(x) + torch.atan(x)), randn(4, 8)),
    Op("erf", lambda: Fn(torch.erf), randn(4, 8)),
    Op("clamp", lambda: Fn(lambda x: x.clamp(-0.5, 0.7)), at_bounds(-0.5, 0.7)),
    Op("clamp_max_of_a_parameter", lambda: _ClampedScale(), randn(2, 3, 4)),
    Op("clamp_min", lambda: Fn(lambda x: x.clamp_min(0.2)), at_bounds(0.2)),
    Op("maximum", lambda: Fn(torch.maximum), two(4, 8)),
    Op("minimum", lambda: Fn(torch.minimum), two(4, 8)),
    Op("div_sub", lambda: Fn(lambda x, y: (x - y) / (y * y + 1)), two(4, 8)),
    Op("greater", lambda: Fn(lambda x, y: torch.where(x > y, x, y * 2)), two(4, 8)),
    Op("less_equal", lambda: Fn(lambda x, y: x * (x <= y).float()), two(4, 8)),
    Op("equal", lambda: Fn(lambda x: x * (torch.round(x) == 0).float()), away_from_zero(4, 8)),
    Op("logical_not", lambda: Fn(lambda x: torch.where(~(x > 0), x, x * x)), away_from_zero(4, 8)),
    Op("logical_and_or", lambda: Fn(lambda x: x * ((x > -1) & (x < 1) | (x > 2)).float()), away_from_zero(4, 8)),
    Op("masked_fill", lambda: Fn(lambda x: x.masked_fill(x < 0, -1e4)), away_from_zero(4, 8)),
    Op("floor_round", lambda: Fn(lambda x: x * torch.floor(x) + torch.round(x)), away_from_zero(4, 8)),
    Op("remainder", lambda: Fn(lambda x: torch.remainder(x, 1.5) * x), away_from_zero(4, 8)),
    Op("fmod", lambda: Fn(lambda x, y: torch.fmod(x, y.abs() + 0.5)), two(4, 8)),
    Op("int_remainder", lambda: Fn(lambda x, i: x * (i % 3).float()), lambda gen: (torch.randn(4, 8, generator=gen), torch.randint(-9, 9, (4, 8), generator=gen))),
    Op("isnan_isinf", lambda: Fn(lambda x: torch.where(torch.isnan(x) | torch.isinf(x), 0.0, x * 2)), randn(4, 8)),
    Op("broadcast_add", lambda: Fn(lambda x, y: x + y[:, :1]), two(4, 8)),
    Op("broadcast_outer", lambda: Fn(lambda x: x.unsqueeze(-1) * x.unsqueeze(-2)), randn(3, 5)),
]

NORMALIZATIONS = [
    Op("layer_norm", lambda: nn.LayerNorm(8), randn(3, 4, 8)),
    Op("layer_norm_2d", lambda: nn.LayerNorm([4, 8]), randn(3, 4, 8)),
    Op("group_norm", lambda: nn.GroupNorm(2, 4), randn(2, 4, 3, 3)),
    Op("instance_norm", lambda: nn.InstanceNorm2d(3, affine=True), randn(2, 3, 4, 4)),
    Op("batch_norm_1d", lambda: nn.BatchNorm1d(8), randn(6, 8)),
    Op("batch_norm_1d_seq", lambda: nn.BatchNorm1d(4), randn(3, 4, 5)),
    Op("batch_norm_2d", lambda: nn.BatchNorm2d(3), randn(2, 3, 4, 4)),
    Op("normalize", lambda: Fn(lambda x: F.normalize(x, dim=-1)), randn(4, 8)),
    Op("weight_norm", lambda: nn.utils.parametrizations.weight_norm(nn.Linear(6, 4)), randn(3, 6)),
    Op("l1_normalized_weight", lambda: _L1Normalized(), randn(3, 6)),
    Op("rms_norm", lambda: nn.RMSNorm(8), randn(3, 8)),
    Op("rms_norm_2d", lambda: nn.RMSNorm([4, 8], eps=1e-5), randn(3, 4, 8)),
    Op("rms_norm_plain", lambda: nn.RMSNorm(8, elementwise_affine=False), double(3, 8)),
    Op("group_norm_1d", lambda: nn.GroupNorm(3, 6), randn(2, 6, 5)),
    Op("instance_norm_1d", lambda: nn.InstanceNorm1d(4, affine=True), randn(2, 4, 6)),
    Op("batch_norm_1d_eval", lambda: _eval_batch_norm(8), randn(6, 8)),
    Op("batch_norm_1d_seq_eval", lambda: _eval_batch_norm(4), randn(3, 4, 5)),
    Op("normalize_dim1", lambda: Fn(lambda x: F.normalize(x, dim=1)), randn(2, 3, 4)),
]

CONVOLUTIONS = [
    Op("conv1d", lambda: nn.Conv1d(3, 4, 3, padding=1), randn(2, 3, 10)),
    Op("conv2d_dilated", lambda: nn.Conv2d(3, 4, 3, dilation=2, padding=2), randn(2, 3, 8, 8)),
    Op("conv2d_depthwise", lambda: nn.Conv2d(4, 4, 3, padding=1, groups=4), randn(2, 4, 6, 6)),
    Op("conv2d_groups", lambda: nn.Conv2d(8, 12, 3, padding=1, groups=2), randn(4, 8, 12, 12)),
    Op("conv2d_stride_rect", lambda: nn.Conv2d(3, 4, (3, 1), stride=(2, 1)), randn(2, 3, 7, 5)),
    Op("conv1d_strided_groups", lambda: nn.Conv1d(4, 6, 3, stride=2, dilation=2, padding=3, groups=2), randn(2, 4, 11)),
    Op("conv2d_same", lambda: nn.Conv2d(3, 4, (4, 3), padding="same", dilation=(1, 2)), randn(1, 3, 6, 7)),
    Op("conv3d", lambda: nn.Conv3d(2, 3, 3, padding=1, stride=(1, 2, 1)), randn(1, 2, 4, 5, 4)),
    Op("conv_transpose2d", lambda: nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1), randn(2, 3, 4, 4)),
    Op("conv_transpose1d", lambda: nn.ConvTranspose1d(3, 2, 4, stride=2), randn(2, 3, 5)),
    Op(
        "conv_transpose2d_groups",
        lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, dilation=2),
        randn(2, 4, 3, 4),
    ),
    Op("conv_transpose3d", lambda: nn.ConvTranspose3d(2, 3, 2, stride=2, bias=False), randn(1, 2, 2, 3, 2)),
    Op("max_pool1d", lambda: nn.MaxPool1d(2), distinct(2, 3, 8)),
    Op("max_pool2d_stride", lambda: nn.MaxPool2d(3, stride=2, padding=1), distinct(2, 3, 7, 7)),
    Op("max_pool1d_dilated", lambda: nn.MaxPool1d(3, stride=2, padding=1, dilation=2), distinct(2, 3, 11)),
    Op("max_pool2d_ceil", lambda: nn.MaxPool2d(2, ceil_mode=True), distinct(1, 2, 5, 5)),
    Op("max_pool3d", lambda: nn.MaxPool3d(2), distinct(2, 2, 4, 4, 4)),
    Op("avg_pool1d", lambda: nn.AvgPool1d(2), randn(2, 3, 8)),
    Op("avg_pool2d_ceil", lambda: nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True), randn(1, 2, 6, 6)),
    Op("avg_pool3d", lambda: nn.AvgPool3d(2, stride=1, padding=1, count_include_pad=False), randn(1, 2, 3, 4, 3)),
    Op("adaptive_avg_pool", lambda: nn.AdaptiveAvgPool2d(1), randn(2, 3, 5, 5)),
    Op("adaptive_avg_pool_2", lambda: nn.AdaptiveAvgPool2d(2), randn(2, 3, 6, 6)),
    Op("interpolate_nearest", lambda: Fn(lambda x: F.interpolate(x, scale_factor=2, mode="nearest")), randn(1, 2, 3, 4)),
    Op("interpolate_bilinear", lambda: Fn(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear")), randn(1, 2, 3, 4)),
    Op(
        "interpolate_bilinear_corners",
        lambda: Fn(lambda x: F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=True)),
        randn(1, 2, 3, 4),
    ),
    Op("interpolate_bilinear_down", lambda: Fn(lambda x: F.interpolate(x, size=(3, 2), mode="bilinear")), randn(1, 2, 7, 5)),
    Op("interpolate_nearest_size", lambda: Fn(lambda x: F.interpolate(x, size=(5, 7))), randn(1, 2, 3, 4)),
    Op("interpolate_linear", lambda: Fn(lambda x: F.interpolate(x, scale_factor=3, mode="linear")), randn(2, 3, 4)),
    Op(
        "interpolate_trilinear",
        lambda: Fn(lambda x: F.interpolate(x, scale_factor=2, mode="trilinear", align_corners=True)),
        randn(1, 1, 2, 3, 2),
    ),
    Op(
        "interpolate_bicubic",
        lambda: Fn(lambda x: F.interpolate(x, size=(7, 9), mode="bicubic")),
        randn(1, 2, 4, 5),
    ),
    Op(
        "interpolate_bicubic_corners_down",
        lambda: Fn(lambda x: F.interpolate(x, size=(3, 2), mode="bicubic", align_corners=True)),
        randn(1, 2, 7, 5),
    ),
    Op("pad_constant", lambda: Fn(lambda x: F.pad(x, (1, 2, 0, 1), value=0.5)), randn(2, 3, 4)),
    Op("pad_reflect", lambda: Fn(lambda x: F.pad(x, (2, 1), mode="reflect")), randn(2, 3, 5)),
    Op("pad_replicate", lambda: Fn(lambda x: F.pad(x, (1, 2, 2, 1), mode="replicate")), randn(1, 2, 4, 4)),
    Op("pad_negative", lambda: Fn(lambda x: F.pad(x, (-1, 2, 1, -1))), randn(2, 4, 5)),
    Op("pad_reflect2d", lambda: nn.ReflectionPad2d((2, 1, 1, 3)), randn(1, 2, 4, 5)),
    Op("pad_replicate3d", lambda: nn.ReplicationPad3d(1), randn(1, 1, 2, 3, 2)),
    Op("pixel_shuffle", lambda: nn.PixelShuffle(2), randn(1, 8, 3, 3)),
    Op("pixel_unshuffle", lambda: nn.PixelUnshuffle(2), randn(1, 2, 4, 6)),
]

SHAPES = [
    Op("expand", lambda: Fn(lambda x: x[:, :1].expand(-1, 6) * x[:, :6]), randn(4, 8)),
    Op("repeat", lambda: Fn(lambda x: x.repeat(2, 3)), randn(3, 4)),
    Op("tile", lambda: Fn(lambda x: torch.tile(x, (2,))), randn(3, 4)),
    Op("repeat_new_dim", lambda: Fn(lambda x: x.repeat(2, 1, 3)), randn(3, 4)),
    Op("split_cat", lambda: Fn(lambda x: torch.cat(list(reversed(x.split([3, 5], dim=-1))), dim=-1)), randn(4, 8)),
    Op("split_unused", lambda: Fn(lambda x: x.split([2, 3, 3], dim=1)[2] * 2), randn(4, 8)),
    Op("chunk_uneven", lambda: Fn(lambda x: x.chunk(3, dim=-1)[1] * x.chunk(3, dim=-1)[2]), randn(4, 7)),
    Op("chunk_stack", lambda: Fn(lambda x: torch.stack(x.chunk(2, dim=-1), dim=0) * 2), randn(4, 8)),
    Op("flip", lambda: Fn(lambda x: x.flip(-1) * x), randn(4, 8)),
    Op("flip_dims", lambda: Fn(lambda x: x.flip(0, 2) * x), randn(2, 3, 4)),
    Op("roll", lambda: Fn(lambda x: torch.roll(x, 2, dims=-1) * x), randn(4, 8)),
    Op(
        "diff",
        lambda: Fn(lambda x, p: torch.diff(x, dim=-1, prepend=p) + torch.diff(x, n=2, dim=0).sum()),
        lambda gen: (torch.randn(4, 8, generator=gen), torch.randn(4, 1, generator=gen)),
    ),
    Op("slice_negative", lambda: Fn(lambda x: x[:, -3:-1] * 2 + x[-2:, :2]), randn(2, 8)),
    Op("transpose_reshape", lambda: Fn(lambda x: x.transpose(1, 2).reshape(2, -1) * 2), randn(2, 3, 4)),
    Op("permute", lambda: Fn(lambda x: x.permute(2, 0, 1).contiguous() + 1), randn(2, 3, 4)),
    Op("slice_step", lambda: Fn(lambda x: x[:, ::2] * x[:, 1::2]), randn(4, 8)),
    Op(
        "gather",
        lambda: Fn(lambda x, i: torch.gather(x, 1, i)),
        lambda gen: (torch.randn(3, 4, 2, generator=gen), torch.randint(0, 4, (3, 6, 2), generator=gen)),
    ),
    Op("index_select", lambda: Fn(lambda x: x[:, torch.tensor([0, 2, 2, 5])]), randn(4, 8)),
    Op("select_from_the_end", lambda: Fn(lambda x: x[:, -1] * x[:, torch.tensor([-2, 0, -8])].sum(-1)), randn(4, 8)),
    Op("select_on_an_axis_of_one", lambda: Fn(lambda x: x[0] * x[:, [0, 0]].sum(1)), randn(1, 1, 5)),
    Op(
        "index_given_at_run_time",
        lambda: Fn(lambda x, i: x[i] * 2),
        lambda gen: (torch.randn(5, 3, generator=gen), torch.tensor([-1, 4, -5, 0])),
    ),
    Op("squeeze_unsqueeze", lambda: Fn(lambda x: x.unsqueeze(1).squeeze(1) * x), randn(4, 8)),
    Op("triu_of_a_product", lambda: Fn(lambda x: torch.triu(x * 2, -1) + torch.tril(x, 1).sum(-1, keepdim=True)), randn(2, 4, 5)),
    Op("tril_mask", lambda: Fn(lambda x: x.masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), 0.0)), randn(2, 8, 8)),
    Op("slice_assigned", lambda: Fn(_shifted_right), two(2, 6)),
    Op(
        "scatter",
        lambda: Fn(lambda x, y: x.scatter(1, torch.tensor([[0, 3, 1], [2, 4, 0]]), y)),
        lambda gen: (torch.randn(2, 5, generator=gen), torch.randn(2, 3, generator=gen)),
    ),
    Op(
        "scatter_add",
        lambda: Fn(lambda x, y: x.scatter_add(1, torch.tensor([[0, 1, 1, 4], [3, 3, 3, 0]]), y)),
        lambda gen: (torch.randn(2, 5, generator=gen), torch.randn(2, 4, generator=gen)),
    ),
    Op("one_hot_of_argmax", lambda: Fn(lambda x: F.one_hot(x.argmax(-1), 6).float() * x.softmax(-1)), randn(3, 6)),
    Op("pad_of_a_slice", lambda: Fn(lambda x: F.pad(x[:, 1:], (1, 2)) * 2), randn(3, 6)),
]

REDUCTIONS = [
    Op("sum_mean", lambda: Fn(lambda x: x.sum(-1) + x.mean(0).sum()), randn(4, 8)),
    Op("max_dim", lambda: Fn(lambda x: x.max(dim=-1).values), distinct(4, 8)),
    Op("min_dim", lambda: Fn(lambda x: x.min(dim=0)[0]), distinct(4, 8)),
    Op("amax", lambda: Fn(lambda x: x.amax(dim=(1, 2))), distinct(2, 3, 4)),
    Op("argmax", lambda: Fn(lambda x: x * x.argmax(dim=-1, keepdim=True).float()), distinct(4, 8)),
    Op("cumsum", lambda: Fn(lambda x: x.cumsum(-1)), randn(4, 8)),
    Op("cumsum_of_a_mask", lambda: Fn(lambda x: x * (x > 0).cumsum(-1)), randn(4, 8)),
    Op("logsumexp", lambda: Fn(lambda x: torch.logsumexp(x, dim=-1)), randn(4, 8)),
    Op("var_std", lambda: Fn(lambda x: x.var(-1) + x.std(-1)), randn(4, 8)),
    Op("norm", lambda: Fn(lambda x: torch.linalg.vector_norm(x, dim=-1)), randn(4, 8)),
    Op("prod", lambda: Fn(lambda x: x.prod(-1)), randn(4, 5)),
    Op("prod_zeros", lambda: Fn(lambda x: x.prod(-1)), with_zeros(2, 3, 4)),
    Op("sum_axes_keepdim", lambda: Fn(lambda x: x.sum(dim=(0, 2), keepdim=True) * x), randn(2, 3, 4)),
    Op("mean_axes", lambda: Fn(lambda x: x.mean(dim=(0, -1))), double(2, 3, 4)),
    # global average pooling written as a mean (imported as GlobalAveragePool)
    Op(
        "mean_spatial",
        lambda: Fn(lambda x: x.mean((2, 3)) * x.mean((-1, -2), keepdim=True)[..., 0, 0]),
        randn(2, 3, 4, 5),
    ),
    Op("sum_square", lambda: Fn(lambda x: (x * x).sum(0)), randn(4, 4)),
    Op("min_all", lambda: Fn(lambda x: x.min() * x), distinct(3, 4)),
    Op("amax_keepdim", lambda: Fn(lambda x: x.amax(0, keepdim=True) * x), distinct(3, 4)),
    # small integers: maxima tie, and amax splits the gradient evenly among them
    Op("amax_ties", lambda: Fn(lambda x: x.amax(-1)), lambda gen: (torch.randint(0, 3, (3, 4), generator=gen).float(),)),
    Op("topk", lambda: Fn(lambda x: torch.topk(x, 3, dim=-1).values), distinct(4, 8)),
    Op("topk_smallest_first_axis", lambda: Fn(lambda x: torch.topk(x, 2, dim=0, largest=False).values), distinct(4, 8)),
    Op("sort", lambda: Fn(lambda x: torch.sort(x, dim=-1, descending=True).values * torch.arange(8.0)), distinct(4, 8)),
    Op("argsort_weights", lambda: Fn(lambda x: x * x.argsort(-1).float()), distinct(4, 8)),
    Op("argmin", lambda: Fn(lambda x: x * x.argmin(dim=0).float()), distinct(4, 8)),
    Op("cumsum_dim0", lambda: Fn(lambda x: x.cumsum(0)), double(3, 4, 2)),
    Op("logsumexp_axes", lambda: Fn(lambda x: torch.logsumexp(x, dim=(1, 2), keepdim=True)), randn(2, 3, 4)),
    Op("norm_l1", lambda: Fn(lambda x: torch.linalg.vector_norm(x, ord=1, dim=-1)), away_from_zero(4, 8)),
    Op("norm_all", lambda: Fn(lambda x: torch.linalg.vector_norm(x) * x), randn(3, 4)),
    Op("logsumexp_all", lambda: Fn(lambda x: torch.logsumexp(x, dim=(0, 1))), randn(3, 4)),
    Op("norm_inf", lambda: Fn(lambda x: torch.linalg.vector_norm(x, ord=float("inf"), dim=-1)), distinct(4, 8)),
]

LINEAR = [
    Op("linear", lambda: nn.Linear(8, 5), randn(3, 8)),
    Op("linear_3d", lambda: nn.Linear(8, 5, bias=False), randn(2, 3, 8)),
    Op("bilinear", lambda: nn.Bilinear(4, 5, 3), lambda gen: (torch.randn(6, 4, generator=gen), torch.randn(6, 5, generator=gen))),
    Op("matmul_batched", lambda: Fn(torch.matmul), lambda gen: (torch.randn(2, 3, 4, generator=gen), torch.randn(2, 4, 5, generator=gen))),
    Op("matmul_broadcast", lambda: Fn(torch.matmul), lambda gen: (torch.randn(2, 3, 4, generator=gen), torch.randn(4, 5, generator=gen))),
    Op(
        "matmul_batch_of_one_transposed",
        lambda: Fn(lambda q, k: q @ k.transpose(-1, -2)),
        lambda gen: (torch.randn(1, 1, 6, 4, generator=gen), torch.randn(1, 1, 5, 4, generator=gen)),
    ),
    Op("outer", lambda: Fn(lambda x: torch.outer(x[0], x[1])), randn(4, 8)),
    Op("matmul_vector", lambda: Fn(lambda x, v: x @ v), lambda gen: (torch.randn(4, 8, generator=gen), torch.randn(8, generator=gen))),
    Op("vector_matmul", lambda: Fn(lambda v, x: v @ x), lambda gen: (torch.randn(4, generator=gen), torch.randn(2, 4, 5, generator=gen))),
    Op("batched_matmul_vector", lambda: Fn(lambda x, v: x @ v), lambda gen: (torch.randn(2, 3, 4, generator=gen), torch.randn(4, generator=gen))),
    Op("einsum", lambda: Fn(lambda x, y: torch.einsum("bij,bkj->bik", x, y)), lambda gen: (torch.randn(2, 3, 4, generator=gen), torch.randn(2, 5, 4, generator=gen))),
    Op("einsum_ellipsis", lambda: Fn(lambda x, y: torch.einsum("...ij,...jk->...ik", x, y)), lambda gen: (torch.randn(2, 3, 4, 5, generator=gen), torch.randn(3, 5, 4, generator=gen))),
    Op("einsum_implicit_broadcast", lambda: Fn(lambda x, y: torch.einsum("bij,bjk", x, y)), lambda gen: (torch.randn(2, 3, 4, generator=gen), torch.randn(1, 4, 5, generator=gen))),
    Op("einsum_diagonal", lambda: Fn(lambda x, y: torch.einsum("bii,bj->bij", x, y)), lambda gen: (torch.randn(2, 3, 3, generator=gen), torch.randn(2, 4, generator=gen))),
    Op("einsum_to_scalar", lambda: Fn(lambda x, y: torch.einsum("ij,kj->", x, y)), lambda gen: (torch.randn(3, 4, generator=gen), torch.randn(2, 4, generator=gen))),
    Op("einsum_sum_and_transpose", lambda: Fn(lambda x: torch.einsum("ijk->kj", x)), randn(3, 4, 5)),
    Op(
        "einsum_batch_in_the_middle",
        lambda: Fn(lambda q, k: torch.einsum("ibnd,jbnd->bnij", q, k)),
        lambda gen: (torch.randn(5, 2, 3, 4, generator=gen), torch.randn(6, 2, 3, 4, generator=gen)),
    ),
    Op("einsum_of_unknown_shape", lambda: Fn(_padded_product), lambda gen: (torch.randn(2, 5, 3, generator=gen), torch.randn(4, 3, generator=gen))),
    Op("dot", lambda: Fn(torch.dot), lambda gen: (torch.randn(6, generator=gen), torch.randn(6, generator=gen))),
    Op("matmul_vectors", lambda: Fn(torch.matmul), lambda gen: (torch.randn(6, generator=gen), torch.randn(6, generator=gen))),
    Op("matmul_broadcast_batch_of_one", lambda: Fn(torch.matmul), lambda gen: (torch.randn(1, 3, 4, generator=gen), torch.randn(2, 4, 5, generator=gen))),
    Op("addmm_scaled_row_bias", lambda: Fn(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0)), _addmm(3, 1)),
    Op("addmm_beta_zero", lambda: Fn(lambda c, a, b: torch.addmm(c, a, b, beta=0.0)), _addmm(3, 5)),
    Op("embedding", lambda: nn.Embedding(10, 6), _embedding_ids),
    Op("sdpa_causal", lambda: Attention(causal=True), _qkv),
    Op("sdpa_mask", lambda: Attention(causal=False), _qkv),
    Op("multihead_attention", MultiheadAttention, randn(2, 5, 16)),
]


class Recurrent(nn.Module):
    """An nn.LSTM, nn.GRU or nn.RNN returning its output and final states as a flat tuple."""

    def __init__(self, rnn: nn.RNNBase):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        output, final = self.rnn(x)
        return (output, *final) if isinstance(final, tuple) else (output, final)


RECURRENT = [
    Op("lstm", lambda: Recurrent(nn.LSTM(6, 5, batch_first=True)), randn(2, 4, 6)),
    Op("lstm_two_layers_bidirectional", lambda: Recurrent(nn.LSTM(6, 5, num_layers=2, bidirectional=True)), randn(3, 2, 6)),
    Op("gru_bidirectional", lambda: Recurrent(nn.GRU(6, 5, batch_first=True, bidirectional=True)), randn(2, 4, 6)),
    Op("rnn_relu_no_bias", lambda: Recurrent(nn.RNN(6, 5, nonlinearity="relu", bias=False)), randn(4, 2, 6)),
    Op("rnn_tanh", lambda: Recurrent(nn.RNN(6, 5, num_layers=2)), randn(4, 2, 6)),
]

LOSSES = [
    Op("cross_entropy", lambda: Loss(F.cross_entropy), _classes),
    Op("cross_entropy_smoothing", lambda: Loss(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1)), _classes),
    Op("nll", lambda: Loss(F.nll_loss), _log_probabilities),
    Op("mse", lambda: Loss(F.mse_loss), _same_shape),
    Op("l1", lambda: Loss(F.l1_loss), _same_shape),
    Op("smooth_l1", lambda: Loss(F.smooth_l1_loss), _same_shape),
    Op("bce_with_logits", lambda: Loss(F.binary_cross_entropy_with_logits), _probabilities),
    Op("kl_div", lambda: Loss(lambda x, t: F.kl_div(x.log_softmax(-1), t.softmax(-1), reduction="batchmean")), _same_shape),
    Op("cross_entropy_smoothing_weighted", lambda: Loss(lambda x, t: F.cross_entropy(x, t, weight=torch.arange(1.0, 6.0), ignore_index=2, label_smoothing=0.2)), _classes),
    Op("cross_entropy_smoothing_sum", lambda: Loss(lambda x, t: F.cross_entropy(x, t, reduction="sum", label_smoothing=0.1)), _classes),
    Op("nll_weighted", lambda: Loss(lambda x, t: F.nll_loss(x, t, weight=torch.arange(1.0, 6.0), ignore_index=1)), _log_probabilities),
    Op("nll_2d_sum", lambda: Loss(lambda x, t: F.nll_loss(x, t, reduction="sum")), _classes_3d),
    Op("nll_none", lambda: Loss(lambda x, t: F.nll_loss(x, t, reduction="none")), _log_probabilities),
    Op("mse_sum", lambda: Loss(lambda x, t: F.mse_loss(x, t, reduction="sum")), _same_shape),
    Op("l1_none", lambda: Loss(lambda x, t: F.l1_loss(x, t, reduction="none")), _same_shape),
    Op("smooth_l1_beta", lambda: Loss(lambda x, t: F.smooth_l1_loss(x, t, beta=0.5, reduction="sum")), _same_shape),
    Op("huber", lambda: Loss(lambda x, t: F.huber_loss(x, t, delta=0.5)), _same_shape),
]

FAMILIES = {
    "activations": ACTIVATIONS,
    "elementwise": ELEMENTWISE,
    "normalizations": NORMALIZATIONS,
    "convolutions": CONVOLUTIONS,
    "shapes": SHAPES,
    "reductions": REDUCTIONS,
    "linear": LINEAR,
    "recurrent": RECURRENT,
    "losses": LOSSES,
}
OPS = {op.name: op for family in FAMILIES.values() for op in family}
