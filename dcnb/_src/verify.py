"""Run a candidate forward+backward and compare outputs, gradients and updated buffers with PyTorch eager."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from . import structure
from .errors import InputError, describe

#: tolerances: |got - want| <= atol * max(1, max|want|) + rtol * |want|, per tensor
RTOL = 1e-4
ATOL = 1e-4


@dataclasses.dataclass(frozen=True)
class Run:
    """What one forward+backward produced, by label ("output", "grad x", "grad lin.weight",
    "buffer bn.running_mean")."""

    tensors: dict[str, torch.Tensor]

    def same_as(self, other: Run) -> bool:
        """Bit for bit the same tensors (one pass over each, where ``compare`` makes about ten)."""
        return self.tensors.keys() == other.tensors.keys() and all(
            torch.equal(t, other.tensors[label]) for label, t in self.tensors.items()
        )


@dataclasses.dataclass(frozen=True)
class Check:
    ok: bool
    max_abs_error: float
    #: the label of the tensor with the largest error relative to its tolerance
    worst: str
    #: max absolute error per label
    errors: dict[str, float]

    @property
    def message(self) -> str | None:
        if self.ok:
            return None
        return (
            f"{self.worst} differs from PyTorch (max abs error {self.errors[self.worst]:.3g}, "
            f"tolerance rtol={RTOL:g}, atol={ATOL:g} scaled by magnitude)"
        )


class Reference:
    """PyTorch's run of the user's module on the example inputs, made once per session, and the check of a
    candidate (the module a step compiled) against it: ``check``.

    ``outputs`` are eager's tensors (``eager``); the reference run differentiates them with fixed upstream
    gradients (``upstream``; None without a backward) and labels the inputs' gradients by ``input_names``. PyTorch's
    run in float64 is made where a check first needs it."""

    def __init__(
        self,
        module: nn.Module,
        inputs: list[torch.Tensor],
        call: structure.Call,
        outputs: list[torch.Tensor],
        input_names: list[str],
        *,
        backward: bool,
        training: bool,
    ):
        self.module = module
        self.inputs = inputs
        self.call = call
        self.outputs = outputs
        self.input_names = input_names
        self.training = training
        self.upstream = grad_outputs(outputs) if backward else None
        self._exact: Run | None = None
        self._other_order: Run | None = None
        try:
            #: what PyTorch computed: outputs, gradients, updated buffers
            self.expected = run(self.called(module), module, inputs, self.upstream, input_names)
        except Exception as e:  # the module's own code refusing inputs that require gradients
            raise InputError(
                f"running {type(module).__name__} with its floating-point inputs requiring gradients (whose "
                f"gradients dcnb checks) failed: {describe(e)}; without the backward (backward=False, "
                "--no-backward) they require none"
            ) from e

    def called(self, fn: Callable[..., Any]) -> Callable[..., list[torch.Tensor]]:
        """``fn`` taking the inputs' tensors in the compiled order and returning its result's tensors."""
        return lambda *tensors: structure.leaves(self.call.invoke(fn, tensors))

    def check(self, candidate: nn.Module) -> Check:
        """Run ``candidate`` (sharing the user's module's parameters) and judge it against PyTorch. Twice where the
        first passes: what a call leaves behind in the binary (a sum zeroed only once) shows on the next call; a
        second run identical to the first passes as the first did, without comparing it all over again."""
        first = self._run(candidate)
        result = self._judge(first)
        if result.ok:
            again = self._run(candidate)
            if not again.same_as(first):
                result = self._judge(again)
        return result

    def _run(self, candidate: nn.Module) -> Run:
        return run(self.called(candidate), self.module, self.inputs, self.upstream, self.input_names)

    def _judge(self, got: Run) -> Check:
        """``got`` against PyTorch; where a tensor is past the tolerance, against PyTorch in float64 too, and where
        one is farther from float64 than PyTorch's float32 allows, against PyTorch's float32 in another order."""
        result = compare(got, self.expected)
        if result.ok:
            return result
        result = compare(got, self.expected, exact=self._exact_run())
        other = None if result.ok or self._exact is None else self._other_order_run()
        return result if other is None else compare(got, self.expected, exact=self._exact, others=(other,))

    def _exact_run(self) -> Run | None:
        """PyTorch's run in float64 (on a copy of the module), made once, where a check fails; None where the module
        cannot run in float64."""
        if self._exact is None:
            with contextlib.suppress(Exception):  # a module that insists on its dtypes: no float64 run to ask
                module = copy.deepcopy(self.module).double().train(self.training)
                inputs = [t.double() if t.is_floating_point() else t for t in self.inputs]
                upstream = self.upstream and [g if g is None else g.double() for g in self.upstream]
                self._exact = run(self.called(module), module, inputs, upstream, self.input_names)
        return self._exact

    def _other_order_run(self) -> Run | None:
        """PyTorch's float32 run summing in another order (one thread, convolutions without oneDNN), made once,
        where a check fails even against float64; None where the module cannot run so. PyTorch's own float32 error
        is one sample: where a gradient is ill-conditioned, another order moves it farther (a full-size ResNet-50 in
        eval mode at batch 4, whose unnormalized activations put many pre-activations within rounding of a ReLU's
        kink: this order's gradients 2-15x as far from float64 as the default order's, dcnb's after auto_optimize
        4-9x)."""
        if self._other_order is None:
            threads = torch.get_num_threads()
            try:
                torch.set_num_threads(1)
                with warnings.catch_warnings(), contextlib.suppress(Exception):
                    warnings.simplefilter("ignore")  # the flags' setter warns about Intel GPUs' TF32
                    with torch.backends.mkldnn.flags(enabled=False):
                        self._other_order = self._run(self.module)
            finally:
                torch.set_num_threads(threads)
        return self._other_order


def eager(module: nn.Module, inputs: Sequence[torch.Tensor], call: structure.Call) -> tuple[list[torch.Tensor], Any]:
    """PyTorch eager's result on the example inputs, without gradients: its tensors, and its structure (tuples,
    dicts, ModelOutput, None: ``structure.skeleton``), which the compiled module returns too."""
    try:
        with torch.no_grad(), preserved(module):
            result = call.invoke(module, inputs)
            return structure.leaves(result), structure.skeleton(result)
    except Exception as e:
        raise InputError(f"running {type(module).__name__} on the example inputs failed: {describe(e)}") from e


def grad_outputs(outputs: list[torch.Tensor], seed: int = 0) -> list[torch.Tensor]:
    """Fixed random upstream gradients, so that every run differentiates the same loss."""
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) if o.is_floating_point() else None
        for o in outputs
    ]


def run(
    fn: Callable[..., object],
    module: nn.Module,
    inputs: list[torch.Tensor],
    upstream: list[torch.Tensor] | None,
    input_names: list[str],
) -> Run:
    """Call fn(*inputs), backpropagate ``upstream``, and collect what changed, leaving the module as it was."""
    with preserved(module):
        args = [_leaf(t, upstream is not None) for t in inputs]
        outputs = structure.leaves(fn(*args))
        tensors = {_output_label(i, len(outputs)): o.detach().clone() for i, o in enumerate(outputs)}
        if upstream is not None:
            pairs = [(o, g) for o, g in zip(outputs, upstream) if g is not None and o.requires_grad]
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
            for name, t in zip(input_names, args):
                if t.grad is not None:
                    tensors[f"grad {name}"] = t.grad.clone()
            for name, p in module.named_parameters():
                if p.grad is not None:
                    tensors[f"grad {name}"] = p.grad.clone()
        for name, b in module.named_buffers():
            tensors[f"buffer {name}"] = b.detach().clone()
    return Run(tensors)


def compare(
    got: Run,
    want: Run,
    rtol: float = RTOL,
    atol: float = ATOL,
    exact: Run | None = None,
    others: Sequence[Run] = (),
) -> Check:
    """Each of PyTorch's tensors in ``want`` against dcnb's in ``got``, within the tolerance scaled by magnitude.

    ``exact`` is PyTorch's run in float64, where there is one: a tensor past its bound still matches if dcnb is no
    farther from it than twice PyTorch's float32 is, at its farthest element or in root mean square (``_as_exact``),
    in ``want``'s order of summation or in one of ``others`` (PyTorch's float32 runs in other orders).
    Some gradients are ill-conditioned (MobileViT's, through a training BatchNorm of a few elements per channel:
    PyTorch's float32 gradient is 0.02 from its float64 one where the largest is 0.034), and summing in another order
    moves them farther than any fixed tolerance allows.
    """
    errors: dict[str, float] = {}
    worst, worst_ratio = "", -1.0
    ok = True
    for label, w in want.tensors.items():
        g = got.tensors.get(label)
        if g is None and label.startswith("grad ") and not torch.count_nonzero(w):
            # PyTorch's zeros for a tensor the exported graph does not read (the export folds a softmax over one
            # element to 1, and attention over one token no longer reads its queries and keys): dcnb's gradient
            # is None, as PyTorch's is for a parameter a forward does not use
            errors[label] = 0.0
            continue
        if g is None:
            ok, worst, worst_ratio = False, label, math.inf
            errors[label] = math.inf
            continue
        if g.shape != w.shape:
            g = g.reshape(w.shape) if g.numel() == w.numel() else g
        if g.shape != w.shape:
            ok, worst, worst_ratio = False, label, math.inf
            errors[label] = math.inf
            continue
        abs_err, ratio = _errors(g, w, rtol, atol)
        errors[label] = abs_err
        if ratio > 1.0 and exact is not None and label in exact.tensors:
            pytorchs = [w] + [o.tensors[label] for o in others if label in o.tensors]
            if any(_as_exact(g, p, exact.tensors[label]) for p in pytorchs):
                ratio = 1.0
        if ratio > 1.0:
            ok = False
        if ratio > worst_ratio:
            worst, worst_ratio = label, ratio
    return Check(ok, max(errors.values(), default=0.0), worst, errors)


def _as_exact(got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor) -> bool:
    """Whether ``got`` is as near ``exact`` (float64) as ``want`` (PyTorch's float32) is: at most twice as far at its
    farthest element (four times, for rounding noise), or at most twice as far in root mean square.

    The second is PyTorch's own test of a compiled model against float64 (``torch._dynamo.utils.same``): in a deep
    network a pre-activation within float32's error of a ReLU's kink takes one side in one summation order and the
    other in another, and the gradients it reaches differ in a few elements by far more than rounding (a full-size
    ResNet-50 in training mode: PyTorch's float32 gradient 0.13 from float64's at its farthest, dcnb's 0.26 at
    another element, both 1.0-1.1x as far in root mean square). In a small tensor one such element moves the root
    mean square too: there (of 100 elements or more), all but one element in a thousand (at least one) within the
    first bound match."""
    if exact.shape != want.shape:
        return False
    exact = exact.to(torch.float64)
    ours = torch.sub(got.reshape(want.shape).to(torch.float64), exact)
    theirs = torch.sub(want.to(torch.float64), exact)
    ours_max, theirs_max = float(ours.abs().max()), float(theirs.abs().max())
    if not math.isfinite(ours_max):
        return False
    # a gradient that is zero but for rounding (a bias before a training BatchNorm: LeViT's, where PyTorch's float32
    # is 5e-5 from a float64 value of 1e-13) is noise in any summation order; the ratio of two noises spreads wider
    noise = float(exact.abs().max()) <= theirs_max
    bound = (4 if noise else 2) * theirs_max
    if ours_max <= bound:
        return True
    if float(ours.square().mean().sqrt()) <= 2 * float(theirs.square().mean().sqrt()):
        return True
    # a kink flipped in a small tensor (a training MobileNetV2's last BatchNorm bias at batch 8, 960 channels: one
    # pre-activation 1.8e-6 from ReLU6's kink moves one channel's gradient by 0.058, where PyTorch's float32 is at
    # most 0.006 from float64) is past both bounds above; all but a few elements are still as near as PyTorch's
    few = max(1, ours.numel() // 1000)
    return ours.numel() >= 100 and float(ours.abs().flatten().kthvalue(ours.numel() - few).values) <= bound


def _errors(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> tuple[float, float]:
    """(max abs error, max error over its bound) of one tensor, in the tensors' own precision and in place where it
    can be (a step's check runs on full-size outputs and gradients: each pass over them counts). nan matches nan
    and an infinity the same infinity; otherwise a nan or inf in either makes the error infinite."""
    if not want.numel():
        return 0.0, 0.0
    dtype = torch.promote_types(got.dtype, want.dtype) if got.is_floating_point() else torch.float64
    if not dtype.is_floating_point:
        dtype = torch.float64
    got, want = got.to(dtype), want.to(dtype)
    diff = torch.sub(got, want).abs_()
    abs_err = float(diff.max())  # nan where any is: no separate pass looking for them
    if not math.isfinite(abs_err):
        same = (torch.isnan(got) & torch.isnan(want)) | (torch.isinf(want) & (got == want))
        diff = diff.nan_to_num_(nan=math.inf, posinf=math.inf).masked_fill_(same, 0.0)
        abs_err = float(diff.max())
    if abs_err == 0.0:
        return 0.0, 0.0
    magnitude = torch.abs(want)
    peak = float(magnitude.max())
    if not math.isfinite(peak):  # nan and inf in want bound nothing
        peak = float(magnitude.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0).max())
    bound = magnitude.mul_(rtol).add_(atol * max(1.0, peak))
    return abs_err, float(diff.div_(bound).max())


def _output_label(i: int, n: int) -> str:
    return "output" if n == 1 else f"output {i}"


def _leaf(t: torch.Tensor, grad: bool) -> torch.Tensor:
    t = t.detach().clone()
    return t.requires_grad_(grad and t.is_floating_point())


@contextlib.contextmanager
def preserved(module: nn.Module, training: bool | None = None) -> Iterator[None]:
    """Leave the user's module as it was, whatever runs inside: each parameter's ``.grad`` (None stays None; a
    gradient stays the same tensor with the same values) and ``requires_grad``, its buffers (BatchNorm's running
    statistics and counter) and every submodule's training flag. Inside, gradients start at None, and the module
    is in ``training`` mode where that is given."""
    params = [(p, p.grad, p.requires_grad) for p in module.parameters()]
    buffers = [
        (owner, name, b, b.detach().clone())
        for owner in module.modules()
        for name, b in owner.named_buffers(recurse=False)
    ]
    modes = [(m, m.training) for m in module.modules()]
    for p, _, _ in params:
        p.grad = None  # autograd then makes new gradient tensors: the user's are never written into
    if training is not None:
        module.train(training)
    try:
        with torch.enable_grad():
            yield
    finally:
        for p, grad, requires_grad in params:
            p.grad = grad
            p.requires_grad_(requires_grad)
        with torch.no_grad():
            for owner, name, b, saved in buffers:
                setattr(owner, name, b)  # a forward may rebind a buffer rather than write into it
                b.copy_(saved)
        for m, mode in modes:
            m.training = mode
