"""Session.module as a drop-in nn.Module (README, "Using the compiled module"): other shapes and modes build on first
use, checkpoints and copies move both ways, gradients of gradients and gradients left out are eager's, and what the
compiled code cannot follow is refused or warned of, never silently different."""

import copy
import io
import pickle

import pytest
import torch
from torch import nn

import dcnb
from dcnb._src import session as session_module

pytestmark = pytest.mark.compile


class TwoHeads(nn.Module):
    """A trunk with a BatchNorm (its mode matters) and two heads (a loss may take one)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.bn = nn.BatchNorm1d(32)
        self.a = nn.Linear(32, 4)
        self.b = nn.Linear(32, 3)

    def forward(self, x):
        h = torch.tanh(self.bn(self.fc(x)))
        return self.a(h), self.b(h)


def _twin(module: nn.Module) -> nn.Module:
    """Eager's copy, with the same parameters and buffers and mode."""
    twin = copy.deepcopy(module)
    twin.load_state_dict(module.state_dict())
    return twin


def _grads(module: nn.Module) -> dict:
    return {name: None if p.grad is None else p.grad.clone() for name, p in module.named_parameters()}


def _assert_same(got, want):
    assert got.keys() == want.keys()
    for name in want:
        if want[name] is None:
            assert got[name] is None, name
        else:
            torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.fixture(scope="module", params=["1", "0"], ids=["cpp", "python"])
def built(request):
    """A session of TwoHeads in eval mode at a batch of 4, through the C++ and the Python call paths."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DCNB_NATIVE", request.param)
        torch.manual_seed(0)
        module = TwoHeads()
        session = dcnb.optimize(module, torch.randn(4, 16), baselines=(), time_budget=0.0)
        yield session, module


def test_other_batch_sizes_build_on_first_use_and_match_eager(built):
    session, module = built
    compiled = session.module
    assert compiled is session.module and not compiled.training
    for batch in (2, 4, 2):
        x = torch.randn(batch, 16)
        got = compiled(x)
        with torch.no_grad():
            want = _twin(module).eval()(x)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    signatures = [str(s) for s in session._states[-1].variants]
    assert signatures == ["((4, 16) float32) in eval mode", "((2, 16) float32) in eval mode"]


def test_a_head_the_loss_leaves_out_keeps_its_gradients_none(built):
    session, module = built
    twin = _twin(module).eval()
    x = torch.randn(4, 16)
    for net in (session.module, twin):
        a, b = net(x)
        a.square().sum().backward()
    _assert_same(_grads(module), _grads(twin))
    assert module.b.weight.grad is None and module.a.weight.grad is not None
    module.zero_grad(set_to_none=True)


def test_a_gradient_penalty_differentiates_the_gradient(built):
    """create_graph=True (WGAN-GP, R1): the input gradient has a history, and the penalty reaches the parameters."""
    session, module = built
    twin = _twin(module).eval()
    x = torch.randn(4, 16)
    grads = {}
    for name, net, owner in (("dcnb", session.module, module), ("torch", twin, twin)):
        xi = x.clone().requires_grad_()
        a, _ = net(xi)
        (gx,) = torch.autograd.grad(a.sum(), xi, create_graph=True)
        assert gx.grad_fn is not None
        (a.mean() + gx.square().sum()).backward()
        grads[name] = _grads(owner)
        owner.zero_grad(set_to_none=True)
    _assert_same(grads["dcnb"], grads["torch"])


def test_modes_follow_train_and_eval(built):
    session, module = built
    compiled = session.module
    twin = _twin(module)
    x = torch.randn(4, 16)
    try:
        compiled.train()
        twin.train()
        got, want = compiled(x)[0], twin(x)[0]  # batch statistics, and the running ones move
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(module.bn.running_mean, twin.bn.running_mean)
        assert module.bn.num_batches_tracked == twin.bn.num_batches_tracked == 1
        # a mode set on the user's module itself is followed too
        module.eval()
        twin.eval()
        with torch.no_grad():
            torch.testing.assert_close(compiled(x)[0], twin(x)[0], rtol=1e-4, atol=1e-5)
        assert not compiled.training
        # what a single build cannot follow: a BatchNorm frozen in a module that trains
        compiled.train()
        module.bn.eval()
        with pytest.raises(dcnb.InputError, match=r"TwoHeads is in training mode but bn in eval mode"):
            compiled(x)
    finally:
        compiled.eval()
        module.load_state_dict(twin.state_dict())


def test_checkpoints_move_both_ways(built):
    session, module = built
    compiled = session.module
    state = compiled.state_dict()
    assert list(state) == list(module.state_dict())
    plain = TwoHeads()
    plain.load_state_dict(state)  # strict: every key the plain module has, no other
    torch.testing.assert_close(plain.fc.weight, module.fc.weight)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    try:
        fresh = TwoHeads().state_dict()
        compiled.load_state_dict(fresh)
        torch.testing.assert_close(module.a.weight, fresh["a.weight"])
        # and the keys a compiled module's checkpoint had before (under "module.")
        compiled.load_state_dict({f"module.{k}": v for k, v in before.items()})
        torch.testing.assert_close(module.a.weight, before["a.weight"])
    finally:
        module.load_state_dict(before)


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_copies_run_on_their_own_parameters(built, how, calls):
    session, module = built
    compiled = session.module
    built_again = calls(session_module.Session, "_built_at")
    if how == "deepcopy":
        copied = copy.deepcopy(compiled)
    elif how == "pickle":
        copied = pickle.loads(pickle.dumps(compiled))
    else:
        buffer = io.BytesIO()
        torch.save(compiled, buffer)
        buffer.seek(0)
        copied = torch.load(buffer, weights_only=False)
    assert copied.module is not module and not copied.training
    with torch.no_grad():
        copied.module.a.weight.mul_(2)  # its own parameters: the original stays as it was
    x = torch.randn(4, 16)
    want = _twin(copied.module).eval()(x)[0]
    torch.testing.assert_close(copied(x)[0], want, rtol=1e-4, atol=1e-5)
    assert not torch.equal(compiled(x)[0], copied(x)[0])
    # a deep copy runs the session's binaries; a pickle builds its session again, once
    assert len(built_again) == (0 if how == "deepcopy" else 1)


def test_hooks_on_the_compiled_module_run_and_those_on_submodules_are_warned_of(built):
    session, module = built
    compiled = session.module
    seen = []
    handles = [compiled.register_forward_hook(lambda m, args, out: seen.append("compiled"))]
    x = torch.randn(4, 16)
    try:
        compiled(x)
        assert seen == ["compiled"]
        handles.append(module.fc.register_forward_hook(lambda m, args, out: seen.append("fc")))
        with pytest.warns(UserWarning, match=r"hooks on fc do not run"):
            compiled(x)
        assert seen == ["compiled", "compiled"]
    finally:
        for h in handles:
            h.remove()


def test_the_number_of_builds_is_bounded(built, monkeypatch):
    session, _ = built
    monkeypatch.setattr(session_module, "MAX_BUILDS", len(session._states[-1].variants))
    with pytest.raises(dcnb.InputError, match=r"at most \d+, as each is a compile"):
        session.module(torch.randn(3, 16))


class Scaled(nn.Module):
    """Values a forward reads besides its parameters: a non-persistent buffer, a plain tensor attribute, a flag."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("mask", torch.ones(8), persistent=False)
        self.offset = torch.zeros(8)

    def forward(self, x, scale: float = 1.0):
        return self.fc(x) * self.mask * scale + self.offset


def test_values_the_forward_reads_are_read_at_call_time_or_refused():
    torch.manual_seed(0)
    module = Scaled()
    x = torch.randn(2, 8)
    session = dcnb.optimize(module, x, kwargs={"scale": 2.0}, baselines=(), time_budget=0.0)
    compiled = session.module
    module.mask[:4] = 0  # a non-persistent buffer: an input of the build, read at each call
    torch.testing.assert_close(compiled(x, scale=2.0), module(x, scale=2.0))
    # left out, the flag would be forward()'s default, not the 2.0 compiled in
    with pytest.raises(dcnb.InputError, match=r"called without scale, which would take its default 1.0"):
        compiled(x)
    module.offset = torch.zeros(8)  # the same values again: a cache computed anew
    compiled(x, scale=2.0)
    module.offset += 1
    with pytest.raises(dcnb.InputError, match=r"Scaled.offset changed since the build"):
        compiled(x, scale=2.0)


class Pooled(nn.Module):
    """Token ids of any length: an embedding, a norm over features, a mean over the sequence."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, ids):
        return self.norm(self.embed(ids)).mean(1)


def test_another_sequence_length_builds_and_trains_like_eager():
    torch.manual_seed(0)
    module = Pooled()
    session = dcnb.optimize(module, torch.randint(0, 20, (2, 6)), baselines=(), time_budget=0.0)
    twin = _twin(module)
    ids = torch.randint(0, 20, (3, 9))
    for net in (session.module, twin):
        net(ids).square().sum().backward()
    _assert_same(_grads(module), _grads(twin))


def test_a_mode_that_cannot_be_built_is_refused_at_the_call_and_the_other_still_runs():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.3), nn.Linear(8, 2))
    session = dcnb.optimize(module, torch.randn(4, 8), baselines=(), time_budget=0.0)
    compiled = session.module.train()
    with pytest.raises(dcnb.DcnbError, match=r"in training mode \(a call of Session.module\) failed: .*1 · Dropout"):
        compiled(torch.randn(4, 8))
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled.eval()(x), module.eval()(x), rtol=1e-4, atol=1e-5)


def test_a_call_with_something_else_than_a_tensor_says_so(built):
    session, _ = built
    with pytest.raises(dcnb.InputError, match=r"TwoHeads was called with a list as tensor input 0"):
        session.module([[0.0] * 16] * 4)
