"""The channels_last action (actions/layout.py): the images around a network's convolutions stored channels-last in
the forward and the backward, PyTorch's convolutions called over them as such, BatchNorm's loops going over rows of
channels (fixes/normalization.py), and every step still what PyTorch computes: outputs, gradients and running
statistics."""

import re

import pytest
import torch
from torch import nn

import dcnb
from dcnb._src import frontend, torch_kernels
from dcnb._src.actions.layout import channels_last_strides
from tests.cpu_sources import cpu_source

pytestmark = pytest.mark.compile


class _Block(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class _Net(nn.Module):
    """ResNet's parts: a strided stem, BatchNorm, ReLU, max pooling, residual blocks, average pooling, a depthwise
    convolution at stride 2 (MobileNet's), global pooling, a classifier."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(channels)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.blocks = nn.Sequential(_Block(channels), _Block(channels))
        self.average = nn.AvgPool2d(3, stride=1, padding=1)
        self.depthwise = nn.Conv2d(channels, channels, 3, stride=2, padding=1, groups=channels)
        self.fc = nn.Linear(channels, 10)

    def forward(self, x):
        x = self.depthwise(self.average(self.blocks(self.pool(torch.relu(self.bn(self.stem(x)))))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _source(session, side: str) -> str:
    runner = session._states[-1].runner
    return cpu_source(runner.forward_binary if side == "forward" else runner.backward_binary)


def _channels_last(desc) -> bool:
    return tuple(int(s) for s in desc.strides) == channels_last_strides(tuple(int(n) for n in desc.shape))


@pytest.mark.parametrize(
    "training, dtype",
    [
        (True, torch.float32),
        pytest.param(True, torch.float64, marks=pytest.mark.deep),
        # (training's forward is the same graph, its batch norm's statistics aside)
        pytest.param(False, torch.float32, marks=pytest.mark.deep),
    ],
    ids=["training", "training-float64", "eval"],
)
def test_the_images_around_the_convolutions_are_channels_last_and_every_result_is_pytorchs(training, dtype):
    torch.manual_seed(0)
    module = _Net().to(dtype).train(training)
    session = dcnb.optimize(module, torch.randn(2, 3, 64, 64, dtype=dtype), baselines=(), time_budget=0.01,
                            training=training)
    (offered,) = [a for a in session.actions() if a.name == "channels_last"]
    # the stem's and its BatchNorm-and-ReLU's outputs (in training mode one node: on_import.activations_into_norms),
    # the pooled image, each block's seven (two convolutions', two BatchNorms', two ReLUs', the sum; in training
    # mode four: each BatchNorm writes its ReLU's, the second after adding the shortcut), the average pooling's; not
    # the depthwise convolution's 8x8 output (fewer pixels than MIN_PIXELS)
    assert offered.matches == (3 + 4 * 2 + 1 if training else 4 + 7 * 2 + 1)
    step = session.apply("channels_last")
    assert step.ok and step.check.ok, step.error
    labels = {"output", "grad stem.weight", "grad blocks.1.conv1.weight", "grad bn.weight", "grad depthwise.weight"}
    if training:
        labels |= {"buffer bn.running_mean", "buffer blocks.0.bn2.running_var"}
    assert labels <= set(step.check.errors), step.check.errors

    images = [d for s in (session.forward_sdfg, session.backward_sdfg) for d in s.arrays.values() if len(d.shape) == 4]
    assert sum(map(_channels_last, images)) >= 2 * offered.matches  # each image and its gradient
    # the inputs and what leaves for PyTorch keep its layout
    assert not _channels_last(session.forward_sdfg.arrays["x"])
    if torch_kernels.library() is not None:
        code = _source(session, "forward")
        strides = ", ".join(map(str, channels_last_strides((2, 16, 16, 16))))
        assert re.search(rf"dcnb_torch_conv\(.*\{{{strides}\}}", code)
    if training:
        # BatchNorm's sums go over rows of channels, into partial sums per chunk of rows
        assert "_part_s_x" in _source(session, "forward") and "_part_s_dy" in _source(session, "backward")


class _Depthwise(nn.Module):
    """MobileNet's and EfficientNet's depthwise convolutions: at stride 2 behind an explicit pad (Hugging Face's
    TensorFlow padding; replicated here, as the export folds zeros into the convolution), dilated with a bias,
    5x5; then EfficientNet's squeeze-and-excitation (global pooling, a gate per channel)."""

    def __init__(self, channels: int = 8):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)
        self.strided = nn.Conv2d(channels, channels, 3, stride=2, groups=channels, bias=False)
        self.dilated = nn.Conv2d(channels, channels, 3, padding=2, dilation=2, groups=channels)
        self.wide = nn.Conv2d(channels, channels, 5, padding=2, groups=channels)
        self.head = nn.Conv2d(channels, 4, 1)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        x = torch.relu(self.strided(nn.functional.pad(x, (0, 1, 0, 1), mode="replicate")))
        x = self.wide(torch.relu(self.dilated(x)) + x)
        return self.head(x * torch.sigmoid(nn.functional.adaptive_avg_pool2d(x, 1)))


@pytest.mark.parametrize("training, dtype", [(True, torch.float64), (False, torch.float32)], ids=["training", "eval"])
def test_depthwise_convolutions_over_channels_last_images_go_over_pixels_of_channels(training, dtype):
    torch.manual_seed(0)
    module = _Depthwise().to(dtype).train(training)
    session = dcnb.optimize(module, torch.randn(2, 3, 34, 34, dtype=dtype), baselines=(), time_budget=0.01,
                            training=training)
    step = session.apply("channels_last")
    assert step.ok and step.check.ok, step.error
    assert {"output", "grad strided.weight", "grad dilated.weight", "grad dilated.bias", "grad stem.weight"} <= set(
        step.check.errors
    )
    # the pad's output, which the strided convolution reads, is laid out too
    padded = [d for d in session.forward_sdfg.arrays.values() if tuple(int(n) for n in d.shape) == (2, 8, 35, 35)]
    assert padded and all(map(_channels_last, padded))
    # the convolutions no library takes (stride 2, dilated) loop over pixels, a vector loop over their channels, as
    # does the global pooling
    for side in ("forward", "backward"):
        assert "_taps[" in _source(session, side), side
    assert "_part[" in _source(session, "backward") and "_sums[c] +=" in _source(session, "forward")


class _ValidPadded(nn.Module):
    """Hugging Face's EfficientNet's TensorFlow padding: a zero pad, more at the end than at the start, before each
    stride-2 convolution exported with ``padding="valid"``: the stem and a convolution of one group (PyTorch's
    kernels), a depthwise 5x5 (dcnb's loops)."""

    def __init__(self, channels: int = 8):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, stride=2, padding="valid", bias=False)
        self.bn = nn.BatchNorm2d(channels)
        self.reduce = nn.Conv2d(channels, channels, 3, stride=2, padding="valid")
        self.depthwise = nn.Conv2d(channels, channels, 5, stride=2, padding="valid", groups=channels)

    def forward(self, x):
        x = nn.functional.silu(self.bn(self.stem(nn.functional.pad(x, (0, 1, 0, 1)))))
        x = torch.tanh(self.reduce(nn.functional.pad(x, (0, 1, 0, 1))))
        return self.depthwise(nn.functional.pad(x, (1, 2, 1, 2)))


def test_zero_pads_before_valid_convolutions_fold_into_them_and_no_padded_image_is_made():
    torch.manual_seed(0)
    module = _ValidPadded().double().train()
    session = dcnb.optimize(module, torch.randn(2, 3, 32, 32, dtype=torch.float64), baselines=(), time_budget=0.01,
                            training=True)
    forward = session.forward_sdfg
    assert not [n for n, _ in forward.all_nodes_recursive() if type(n).__name__.startswith("ONNXPad")]
    shapes = {tuple(int(n) for n in d.shape) for d in forward.arrays.values()}
    assert not shapes & {(2, 3, 33, 33), (2, 8, 17, 17), (2, 8, 11, 11)}  # the padded images
    # for a GPU, whose cuDNN takes even pads only, the pads stay
    kept = frontend.import_module(module, (torch.randn(2, 3, 32, 32, dtype=torch.float64),), training=True,
                                  uneven_pads=False)
    assert len([n for n, _ in kept.sdfg.all_nodes_recursive() if type(n).__name__.startswith("ONNXPad")]) == 3
    for step in (session.current, session.apply("channels_last")):
        assert step.ok and step.check.ok, step.error
        assert {"output", "grad stem.weight", "grad reduce.weight", "grad depthwise.weight"} <= set(step.check.errors)
        # the convolutions of one group, their pads uneven, are PyTorch's, which the bridge pads for, forward and
        # backward (the second's input's gradient too)
        uneven = r"\(const int64_t\[\]\)\{0, 0, 1, 1\}"
        assert len(re.findall(rf"dcnb_torch_conv\(.*{uneven}", _source(session, "forward"))) == 2
        assert len(re.findall(rf"dcnb_torch_conv_backward\(.*{uneven}", _source(session, "backward"))) == 2


def test_a_network_without_convolutions_has_nothing_to_lay_out():
    session = dcnb.optimize(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), torch.randn(4, 8), baselines=(),
                            time_budget=0.01)
    (offered,) = [a for a in session.actions() if a.name == "channels_last"]
    assert offered.matches == 0
    step = session.apply("channels_last")
    assert not step.ok and "channels_last matches nothing" in step.error


class _SqueezeExcitations(nn.Module):
    """Squeeze-and-excitation written out: pooled with ``mean((2, 3), keepdim=True)`` and gated by 1x1
    convolutions (timm's), then pooled with ``mean((-1, -2))`` and gated by linear layers whose sigmoid is made an
    image with ``[:, :, None, None]`` (the paper's, and many a hand-written network's)."""

    def __init__(self, channels: int = 8):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)
        self.reduce, self.expand = nn.Conv2d(channels, 2, 1), nn.Conv2d(2, channels, 1)
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(channels, 2), nn.Linear(2, channels)
        self.head = nn.Conv2d(channels, 4, 1)

    def forward(self, x):
        x = nn.functional.silu(self.bn(self.stem(x)))
        x = x * torch.sigmoid(self.expand(torch.relu(self.reduce(x.mean((2, 3), keepdim=True)))))
        x = torch.relu(self.conv(x))
        return self.head(x * torch.sigmoid(self.fc2(torch.relu(self.fc1(x.mean((-1, -2))))))[:, :, None, None])


def test_squeeze_and_excitations_written_with_means_and_views_are_laid_out_and_differentiated():
    torch.manual_seed(0)
    module = _SqueezeExcitations().double()
    session = dcnb.optimize(module, torch.randn(2, 3, 20, 20, dtype=torch.float64), baselines=(), time_budget=0.01)
    assert session.current.ok and session.current.check.ok, session.current.error
    step = session.apply("channels_last")
    assert step.ok and step.check.ok, step.error
    assert {"output", "grad fc1.weight", "grad reduce.weight", "grad stem.weight"} <= set(step.check.errors)
    # the images the means read are laid out as their neighbours, and each mean sums a vector of channels at a time
    images = [d for d in session.forward_sdfg.arrays.values() if tuple(int(n) for n in d.shape) == (2, 8, 20, 20)]
    assert images and all(map(_channels_last, images))
    assert _source(session, "forward").count("_sums[c] +=") == 2


def test_a_scale_over_channels_last_pixels_sums_its_gradient_in_their_memory_order():
    # a squeeze-and-excitation's scale gradient sums each channel over the pixels: its terms are laid out as the
    # image is, each pixel's channels innermost, and summed down those columns, where they went per channel across
    # the pixels (EfficientNet-B0's first block: 6.4 ms against 0.3 for its forward)
    torch.manual_seed(0)
    module = _SqueezeExcitations(channels=16).double()
    session = dcnb.optimize(module, torch.randn(2, 3, 20, 20, dtype=torch.float64), baselines=(), time_budget=0.01)
    step = session.apply("channels_last")
    assert step.ok and step.check.ok, step.error
    arrays = session.backward_sdfg.arrays
    terms = {n: tuple(int(s) for s in d.shape) for n, d in arrays.items() if n.endswith("_terms") and len(d.shape) == 4}
    assert sorted(terms.values()) == [(2, 20, 20, 16)] * 2, terms
    calls = [line for line in _source(session, "backward").splitlines() if "reduce_columns_" in line]
    assert all(any(f"{name}[0]" in line for line in calls) for name in terms), calls


class _ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: a depthwise 7x7 convolution, the image permuted to (N, H, W, C) for a LayerNorm and two
    linear layers around GELU, a scale per channel, permuted back and added to the block's input."""

    def __init__(self, channels: int = 8):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 4, stride=4)
        self.dwconv = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm = nn.LayerNorm(channels)
        self.fc1, self.fc2 = nn.Linear(channels, 4 * channels), nn.Linear(4 * channels, channels)
        self.scale = nn.Parameter(torch.full((channels,), 0.5))
        self.head = nn.Conv2d(channels, 4, 1)

    def forward(self, x):
        x = self.stem(x)
        y = self.norm(self.dwconv(x).permute(0, 2, 3, 1))
        y = self.scale * self.fc2(nn.functional.gelu(self.fc1(y)))
        return self.head(x + y.permute(0, 3, 1, 2))


def test_images_on_either_side_of_a_permutation_are_laid_out_and_what_is_permuted_is_not():
    # the depthwise convolution's output, which the permutation reads, and the permuted-back image the block adds
    # were left (N, C, H, W): each permutation then a transpose of the whole image, four a block with the backward's
    # (ConvNeXt-T: 77 ms of its 870, eager's copies 19). Laid out, each reads and writes in one memory order
    torch.manual_seed(0)
    module = _ConvNeXtBlock().double()
    session = dcnb.optimize(module, torch.randn(2, 3, 64, 64, dtype=torch.float64), baselines=(), time_budget=0.01)
    step = session.apply("channels_last")
    assert step.ok and step.check.ok, step.error
    assert {"output", "grad dwconv.weight", "grad norm.weight", "grad fc1.weight", "grad scale"} <= set(
        step.check.errors
    )
    for sdfg in (session.forward_sdfg, session.backward_sdfg):
        def shaped(shape):
            return [d for d in sdfg.arrays.values() if d.transient and tuple(int(n) for n in d.shape) == shape]

        images, permuted = shaped((2, 8, 16, 16)), shaped((2, 16, 16, 8)) + shaped((2, 16, 16, 32))
        assert images and all(map(_channels_last, images)), sdfg.name
        # what the LayerNorm and the linear layers read keeps its last axis, the channels, innermost
        assert permuted and all(d.strides[-1] == 1 for d in permuted), sdfg.name
