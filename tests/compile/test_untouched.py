"""dcnb never changes the user's objects: optimize, apply, undo, reset and replay leave the module and the example
inputs as they were (parameters, their gradients and requires_grad, buffers, every submodule's training flag)."""

import pytest
import torch
from torch import nn

import dcnb

pytestmark = pytest.mark.compile


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4 * 4 * 4, 4)
        self.head.bias.requires_grad_(False)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).flatten(1))


def _snapshot(module: nn.Module, inputs: list[torch.Tensor]) -> dict:
    return {
        "state": {k: v.clone() for k, v in module.state_dict().items()},
        "grads": {n: (p.grad, None if p.grad is None else p.grad.clone()) for n, p in module.named_parameters()},
        "requires_grad": {n: p.requires_grad for n, p in module.named_parameters()},
        "training": {n: m.training for n, m in module.named_modules()},
        "objects": {n: p for n, p in module.named_parameters()} | {n: b for n, b in module.named_buffers()},
        "inputs": [(t.grad, t.requires_grad, t.clone()) for t in inputs],
    }


def _assert_as_before(module: nn.Module, inputs: list[torch.Tensor], before: dict, when: str) -> None:
    state = module.state_dict()
    for k, v in before["state"].items():
        assert torch.equal(state[k], v), f"{when}: {k} changed"
    for n, p in module.named_parameters():
        grad, values = before["grads"][n]
        assert p.grad is grad, f"{when}: {n}.grad is another tensor (or None no more)"
        assert values is None or torch.equal(p.grad, values), f"{when}: {n}.grad's values changed"
        assert p.requires_grad == before["requires_grad"][n], f"{when}: {n}.requires_grad changed"
    assert {n: m.training for n, m in module.named_modules()} == before["training"], f"{when}: training flags changed"
    objects = {n: p for n, p in module.named_parameters()} | {n: b for n, b in module.named_buffers()}
    assert all(objects[n] is t for n, t in before["objects"].items()), f"{when}: a parameter or buffer was replaced"
    for t, (grad, requires_grad, values) in zip(inputs, before["inputs"]):
        assert t.grad is grad and t.requires_grad == requires_grad and torch.equal(t, values), f"{when}: an input changed"


@pytest.mark.parametrize("training", [False, True], ids=["eval", "training"])
def test_optimize_apply_undo_reset_and_replay_leave_the_module_as_it_was(training):
    torch.manual_seed(0)
    module = Net()
    module.train(not training)  # the session runs it in the other mode: the user's flag must come back
    module.conv.weight.grad = torch.randn_like(module.conv.weight)  # a gradient the user has; the others are None
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    before = _snapshot(module, [x])
    # torch.compile's baseline ran a forward and backward of the module outside any guard (gradients set)
    baselines = ("torch", "torch_compile") if not training else ("torch",)
    session = dcnb.optimize(module, x, training=training, baselines=baselines, time_budget=0.05)
    assert session.current.ok, session.current.error
    _assert_as_before(module, [x], before, "optimize")
    assert session.apply("fuse_rows").ok
    _assert_as_before(module, [x], before, "apply")
    assert not session.apply("tasklet_fusion", where=["no such node"]).ok
    _assert_as_before(module, [x], before, "a failed apply")
    session.undo()
    session.reset()
    _assert_as_before(module, [x], before, "undo and reset")
    dcnb.replay(module, x, recipe=[{"name": "fuse_rows"}], training=training, baselines=(), time_budget=0.01)
    _assert_as_before(module, [x], before, "replay")


def test_a_module_that_writes_into_its_input_is_refused_and_leaves_the_users_tensor_alone():
    class Scale(nn.Module):
        def forward(self, x):
            x.mul_(2)
            return x + 1

    x = torch.randn(4, 8)
    kept = x.clone()
    with pytest.raises(dcnb.InputError, match="writes into its input"):
        dcnb.optimize(Scale(), x, backward=False, baselines=("torch",), time_budget=0.05)
    assert torch.equal(x, kept)
