"""The model zoo: small versions of the modules people bring to dcnb, with example inputs.

Shared by tests/compile/test_zoo.py (correctness of every step) and benchmarks/zoo.py (the zoo table of
docs/coverage.md).
Shapes are small: the suite compiles each model's forward and backward several times.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

# --- activations and normalizations, one op each ------------------------------------------------------------------


class Mish(nn.Module):
    """F.mish, which the exporter turns into the ONNX Mish op."""

    def forward(self, x):
        return F.mish(x)


class RMSNorm(nn.Module):
    """RMS normalization written out, as LLaMA-style code does (mean of squares, rsqrt, scale)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


# --- small networks -----------------------------------------------------------------------------------------------


class MLP(nn.Module):
    """Linear, LayerNorm, GELU, LogSoftmax, and the negative log-likelihood loss of the given targets."""

    def __init__(self, width: int = 16, classes: int = 5):
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.fc2 = nn.Linear(width, classes)

    def forward(self, x, target):
        logp = F.log_softmax(self.fc2(F.gelu(self.norm(self.fc1(x)))), dim=-1)
        return F.nll_loss(logp, target)


class ConvNet(nn.Module):
    """Conv, BatchNorm, ReLU, MaxPool, AvgPool, Flatten, Linear."""

    def __init__(self, channels: int = 3, classes: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(6)
        self.fc = nn.Linear(6 * 2 * 2, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.avg_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(x, 1))


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with BatchNorm, a projection shortcut, ReLU."""

    def __init__(self, cin: int = 4, cout: int = 8, stride: int = 2):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class Bottleneck(nn.Module):
    """ResNet's bottleneck block: 1x1 reduce, 3x3, 1x1 expand, identity shortcut."""

    def __init__(self, channels: int = 8, width: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + x)


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise, 1x1 project (ReLU6), residual."""

    def __init__(self, channels: int = 4, expand: int = 3):
        super().__init__()
        hidden = channels * expand
        self.expand = nn.Sequential(nn.Conv2d(channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6())
        self.depthwise = nn.Sequential(
            nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()
        )
        self.project = nn.Sequential(nn.Conv2d(hidden, channels, 1, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x):
        return x + self.project(self.depthwise(self.expand(x)))


class MBConv(nn.Module):
    """EfficientNet's block: expand, depthwise, squeeze-and-excitation, project, all with SiLU."""

    def __init__(self, channels: int = 4, expand: int = 2, squeeze: int = 2):
        super().__init__()
        hidden = channels * expand
        self.expand = nn.Sequential(nn.Conv2d(channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.SiLU())
        self.depthwise = nn.Sequential(
            nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False), nn.BatchNorm2d(hidden), nn.SiLU()
        )
        self.se_reduce = nn.Conv2d(hidden, squeeze, 1)
        self.se_expand = nn.Conv2d(squeeze, hidden, 1)
        self.project = nn.Sequential(nn.Conv2d(hidden, channels, 1, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x):
        y = self.depthwise(self.expand(x))
        scale = torch.sigmoid(self.se_expand(F.silu(self.se_reduce(F.adaptive_avg_pool2d(y, 1)))))
        return x + self.project(y * scale)


class CausalSelfAttention(nn.Module):
    """GPT-style attention written by hand: fused qkv, split heads, causal mask, softmax, output projection."""

    def __init__(self, dim: int = 16, heads: int = 2, length: int = 6):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("mask", torch.tril(torch.ones(length, length, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MixerBlock(nn.Module):
    """MLP-Mixer's block: token mixing across patches, then channel mixing, each LayerNorm + MLP + residual."""

    def __init__(self, patches: int = 6, dim: int = 8, hidden: int = 12):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.tokens = nn.Sequential(nn.Linear(patches, hidden), nn.GELU(), nn.Linear(hidden, patches))
        self.norm2 = nn.LayerNorm(dim)
        self.channels = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x):
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


class PreNormResidual(nn.Module):
    """x + Linear(LayerNorm(x)): the residual pattern of every pre-norm transformer."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.fc(self.norm(x))


class SmallNet(nn.Module):
    """The network trained for a few SGD steps: Conv, BatchNorm, ReLU, pooling, a Linear head."""

    def __init__(self, classes: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 4 * 4, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(torch.flatten(x, 1))


# --- the zoo ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    """A zoo entry: how to make the module and its example inputs, and the modes it behaves differently in."""

    name: str
    make: Callable[[], nn.Module]
    inputs: Callable[[], tuple[torch.Tensor, ...]]
    #: training flags to check: (False, True) where training mode computes something else (BatchNorm)
    modes: tuple[bool, ...] = (False,)
    #: larger inputs for benchmarks/zoo.py (the same module); None: the test inputs
    bench: Callable[[], tuple[torch.Tensor, ...]] | None = None

    def build(self, seed: int = 0, bench: bool = False) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        """A fresh module with random (seeded) parameters and statistics, and its inputs."""
        torch.manual_seed(seed)
        module = self.make()
        for buffer_name, buffer in module.named_buffers():
            if buffer_name.endswith("running_mean"):  # not the fresh zeros/ones: eval mode must use them
                buffer.copy_(0.1 * torch.randn_like(buffer))
            elif buffer_name.endswith("running_var"):
                buffer.copy_(1 + 0.2 * torch.rand_like(buffer))
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):  # random affine parameters, so that their gradients are not trivial
                nn.init.normal_(m.weight, 1.0, 0.2)
                nn.init.normal_(m.bias, 0.0, 0.2)
        return module, (self.bench if bench and self.bench else self.inputs)()


def _x(*shape: int, scale: float = 1.0) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: (scale * torch.randn(*shape),)


def _mlp_inputs(batch: int = 6) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: (torch.randn(batch, 16), torch.randint(0, 5, (batch,)))


BOTH = (False, True)

# benchmark shapes grow the batch (and the image, where the module allows): the layers stay small
ZOO: list[Case] = [
    Case("mish", Mish, _x(2, 3, 8), bench=_x(64, 64, 64)),
    Case("silu", nn.SiLU, _x(2, 3, 8), bench=_x(64, 64, 64)),
    Case("gelu", nn.GELU, _x(2, 3, 8), bench=_x(64, 64, 64)),
    Case("gelu_tanh", lambda: nn.GELU(approximate="tanh"), _x(2, 3, 8), bench=_x(64, 64, 64)),
    Case("hardswish", nn.Hardswish, _x(2, 3, 8, scale=4), bench=_x(64, 64, 64, scale=4)),
    Case("hardsigmoid", nn.Hardsigmoid, _x(2, 3, 8, scale=4), bench=_x(64, 64, 64, scale=4)),
    Case("softmax", lambda: nn.Softmax(dim=-1), _x(3, 4, 8), bench=_x(64, 64, 64)),
    Case("log_softmax", lambda: nn.LogSoftmax(dim=-1), _x(3, 4, 8), bench=_x(64, 64, 64)),
    Case("layer_norm", lambda: nn.LayerNorm(8), _x(3, 5, 8), bench=_x(2048, 64, 8)),
    Case("rms_norm", lambda: RMSNorm(8), _x(3, 5, 8), bench=_x(2048, 64, 8)),
    Case("prenorm_residual", PreNormResidual, _x(3, 5, 16), bench=_x(1024, 64, 16)),
    Case("mlp", MLP, _mlp_inputs(), bench=_mlp_inputs(4096)),
    Case("convnet", ConvNet, _x(2, 3, 8, 8), BOTH, bench=_x(256, 3, 8, 8)),
    Case("resnet_basic", BasicBlock, _x(2, 4, 6, 6), BOTH, bench=_x(64, 4, 16, 16)),
    Case("resnet_bottleneck", Bottleneck, _x(2, 8, 5, 5), BOTH, bench=_x(64, 8, 16, 16)),
    Case("mobilenet_v2", InvertedResidual, _x(2, 4, 5, 5), BOTH, bench=_x(64, 4, 16, 16)),
    Case("mbconv", MBConv, _x(2, 4, 5, 5), BOTH, bench=_x(64, 4, 16, 16)),
    Case(
        "transformer",
        lambda: nn.TransformerEncoderLayer(16, 2, dim_feedforward=24, dropout=0.0, batch_first=True),
        _x(2, 5, 16),
        bench=_x(64, 32, 16),
    ),
    Case("causal_attention", CausalSelfAttention, _x(2, 6, 16), bench=_x(512, 6, 16)),
    Case("mixer", MixerBlock, _x(2, 6, 8), bench=_x(512, 6, 8)),
    Case("small_net", SmallNet, _x(8, 1, 8, 8), BOTH, bench=_x(256, 1, 8, 8)),
]

CASES = {case.name: case for case in ZOO}
