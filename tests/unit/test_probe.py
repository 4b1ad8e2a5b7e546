"""What the export would get wrong without a word, refused before it runs (dcnb/_src/probe.py): no compiles."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from tests.zoo import ZOO

import dcnb
from dcnb._src.probe import check_forward


class Branch(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return 2 * x
        return x


class OnParameters(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))

    def forward(self, x):
        return x * self.w if bool((self.w > 0).all()) else x


class Viewed(nn.Module):
    def forward(self, x):
        # a write through a view is a write into x
        x.view(-1)[0] = 1
        return x


class Fine(nn.Module):
    """In-place ops on its own tensors, and Python values from tensors that are constants: nothing to refuse."""

    def forward(self, x):
        y = x * float(torch.tensor(2.0))
        y.add_(1)
        return F.relu(y, inplace=True)[: int(torch.tensor(2))]


@pytest.mark.parametrize(("name", "training"), [(c.name, t) for c in ZOO for t in c.modes])
def test_the_zoo_passes_and_is_left_as_it_was(name, training):
    case = next(c for c in ZOO if c.name == name)
    module, inputs = case.build()
    state = {k: v.clone() for k, v in module.state_dict().items()}
    given = [t.clone() for t in inputs]
    check_forward(module, inputs, backward=True, training=training)
    assert all(torch.equal(state[k], v) for k, v in module.state_dict().items())
    assert all(torch.equal(a, b) for a, b in zip(given, inputs)) and module.training


def test_fine_modules_pass():
    check_forward(Fine(), [torch.rand(3)], backward=True, training=False)


@pytest.mark.parametrize(
    ("module", "inputs", "words"),
    [
        (
            Branch(),
            [torch.rand(4)],
            ["Branch's forward depends on its data in Python (test_probe.py:", "`if x.sum() > 0:`"],
        ),
        (
            OnParameters(),
            [torch.rand(2)],
            ["into a Python bool", "`return x * self.w if bool((self.w > 0).all()) else x`"],
        ),
        (
            Viewed(),
            [torch.rand(2, 2)],
            ["writes into its input `x` in place (Tensor.__setitem__", "`x.view(-1)[0] = 1`"],
        ),
        # a module of torch.nn itself: no line of the user's to name
        (
            nn.ReLU(inplace=True),
            [torch.rand(3)],
            ["ReLU writes into its input `input` in place (torch.nn.functional.relu)"],
        ),
        (nn.Flatten(), [torch.arange(6).reshape(2, 3)], ["Flatten has nothing to differentiate"]),
    ],
    ids=["branch", "branch on parameters", "write through a view", "torch.nn in place", "nothing to differentiate"],
)
def test_the_session_refuses_what_the_export_would_get_wrong(module, inputs, words):
    given = [t.clone() for t in inputs]
    with pytest.raises(dcnb.InputError) as raised:
        dcnb.optimize(module, *inputs, baselines=())
    for w in words:
        assert w in str(raised.value)
    assert all(torch.equal(a, b) for a, b in zip(given, inputs))  # the refused module wrote into a copy


def test_forward_only_needs_no_gradient_and_a_bad_budget_is_named():
    check_forward(nn.Flatten(), [torch.arange(6).reshape(2, 3)], backward=False, training=False)
    with pytest.raises(dcnb.InputError, match=r"time_budget must be a number of seconds, 0 or more \(0: the fewest runs\), not nan"):
        dcnb.optimize(nn.Flatten(), torch.rand(2, 3), time_budget=float("nan"))
