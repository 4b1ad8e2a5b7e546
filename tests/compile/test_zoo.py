"""The model zoo (tests/zoo.py) through dcnb, checked against PyTorch eager in fp32.

Every check compares the outputs, the gradient of every floating-point input, the gradient of every parameter and
every buffer after the call (BatchNorm's running statistics and counter) with PyTorch's, each within
|dcnb - torch| <= 1e-4 * max(1, max|torch|) + 1e-4 * |torch| (dcnb/_src/verify.py), in eval mode and, where
BatchNorm makes it differ, in training mode.

The default suite builds a representative set (DEFAULT, ACTION_MODELS): one entry of each kind of graph, together
touching every op the fixes in dcnb/_src/fixes/ cover, and every action on a dense network with a loss and on a
convolutional network in training mode. ``pytest --zoo -m zoo`` (``make zoo``) adds the rest: every entry in every
mode, and every action on more kinds of graph. ``benchmarks/zoo.py --sweep`` runs every action on every entry.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import dcnb
from tests.zoo import CASES, ZOO, SmallNet

pytestmark = pytest.mark.compile

#: entries the default suite builds: an activation, a norm written out, dense layers with LayerNorm, GELU and the
#: loss, convolutions with BatchNorm (eval and training), max and average pooling (attention's masking is covered by
#: tests/compile/test_fixes.py, the residual around LayerNorm there too)
DEFAULT = {("gelu_tanh", False), ("rms_norm", False), ("mlp", False), ("convnet", False), ("convnet", True)}
#: (entry, training) the actions are applied to: dense layers with a loss; convolutions with BatchNorm training
ACTION_MODELS = [("mlp", False), ("small_net", True)]
#: and, with --zoo, attention and a ResNet block in training mode
MORE_ACTION_MODELS = [("causal_attention", False), ("resnet_basic", True)]


def _params(entries, default):
    """pytest params of (name, training) with ids; those outside ``default`` are marked ``zoo`` (run with --zoo)."""
    return [
        pytest.param(name, training, id=f"{name}-{'train' if training else 'eval'}", marks=() if (name, training) in default else pytest.mark.zoo)
        for name, training in entries
    ]


ENTRIES = [(case.name, training) for case in ZOO for training in case.modes]
ACTIONS = [
    "expand", "map_fusion", "subgraph_fusion", "tasklet_fusion", "vectorization", "simplify_algebra", "fuse_rows",
    "auto_optimize",
]
#: vectors of 4 floats: the zoo's small rows hold whole vectors, on any CPU
OPTIONS = {"vectorization": {"vector_len": 4}}
#: what an action says when it matches nothing
NOTHING_TO_DO = "matches nothing"
#: actions that cannot act on an entry, and the reason they give (none may be a correctness failure)
#: (none now: a training BatchNorm's statistics, which tasklet_fusion fused into a map whose centred input DaCe's
#: autodiff could not store, are C++ loops with a backward rule of their own)
CANNOT_APPLY: dict[tuple[str, str], str] = {}


@dataclasses.dataclass
class Entry:
    module: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    session: dcnb.Session


@pytest.fixture(scope="module")
def entries():
    """Naive sessions of zoo entries by (name, training), each built once for this module's tests."""
    built: dict[tuple[str, bool], Entry] = {}

    def get(name: str, training: bool) -> Entry:
        if (name, training) not in built:
            module, inputs = CASES[name].build()
            session = dcnb.optimize(module, *inputs, training=training, baselines=(), time_budget=0.01)
            built[name, training] = Entry(module, inputs, session)
        return built[name, training]

    return get


def _assert_all_checked(entry: Entry, step: dcnb.Step) -> None:
    """The step compared everything PyTorch produces: outputs, input and parameter gradients, buffers."""
    assert step.ok and step.check.ok, step.error
    labels = set(step.check.errors)
    params = {f"grad {n}" for n, p in entry.module.named_parameters() if p.requires_grad}
    buffers = {f"buffer {n}" for n, _ in entry.module.named_buffers()}
    assert params | buffers <= labels
    floating = sum(t.is_floating_point() for t in entry.inputs)
    assert len({label for label in labels if label.startswith("grad ")} - params) == floating
    with torch.no_grad():  # on a copy: in training mode the call moves BatchNorm's statistics
        outputs = copy.deepcopy(entry.module)(*entry.inputs)
    count = 1 if isinstance(outputs, torch.Tensor) else len(outputs)
    assert len({label for label in labels if label.startswith("output")}) == count


def _matches(session: dcnb.Session, action: str) -> int:
    """Places the session offers ``action`` at (counted on the SDFGs it transforms, not on the compiled ones the
    build passes changed; vectorization at every width it tries, 4 included)."""
    return next(a.matches for a in session.actions() if a.name == action)


@pytest.mark.parametrize("name,training", _params(ENTRIES, DEFAULT))
def test_naive_build_matches_pytorch(entries, name, training):
    entry = entries(name, training)
    _assert_all_checked(entry, entry.session.current)


@pytest.mark.parametrize("name,training", _params([e for e in ENTRIES if e[1]], DEFAULT | {("small_net", True)}))
def test_training_updates_the_running_statistics_like_pytorch(entries, name, training):
    entry = entries(name, training)
    reference, _ = CASES[name].build()
    initial = copy.deepcopy(entry.module.state_dict())
    reference.load_state_dict(initial)
    try:
        for _ in range(2):  # the statistics of two batches, and the counter at 2
            entry.session.module(*entry.inputs)
            reference(*entry.inputs)
        for buffer_name, buffer in reference.named_buffers():
            torch.testing.assert_close(entry.module.get_buffer(buffer_name), buffer, rtol=1e-4, atol=1e-5)
            assert not torch.equal(buffer, initial[buffer_name]), buffer_name
    finally:  # the session's later steps compare with PyTorch from the state it was built in
        entry.module.load_state_dict(initial)


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("name,training", _params(ACTION_MODELS + MORE_ACTION_MODELS, set(ACTION_MODELS)))
def test_every_action_keeps_the_zoo_correct(entries, name, training, action):
    entry = entries(name, training)
    session = entry.session
    options = OPTIONS.get(action, {})
    matches = _matches(session, action)
    step = session.apply(action, **options)
    try:
        if (name, action) in CANNOT_APPLY:
            assert not step.ok and CANNOT_APPLY[name, action] in step.error
        elif matches == 0:
            assert not step.ok and NOTHING_TO_DO in step.error, step.error
        else:
            _assert_all_checked(entry, step)
    finally:
        if step.ok:
            session.undo()


def test_an_action_that_matches_on_one_side_only_applies_there():
    # subgraph_fusion refused a step when one side had no group: offered on a pre-norm block's forward, it failed
    # on its backward ("finds no group of maps it can fuse")
    module, inputs = CASES["prenorm_residual"].build()
    session = dcnb.optimize(module, *inputs, baselines=(), time_budget=0.01)
    assert [place.side for place in session.places("subgraph_fusion")] == ["forward"]
    step = session.apply("subgraph_fusion")
    assert step.ok and step.check.ok and step.applied == 1, step.error


def test_a_small_network_trains_like_pytorch_through_the_session_module():
    torch.manual_seed(0)
    ours, reference = SmallNet(), SmallNet()
    reference.load_state_dict(ours.state_dict())
    x, target = torch.randn(8, 1, 8, 8), torch.randint(0, 3, (8,))
    session = dcnb.optimize(ours, x, training=True, baselines=(), time_budget=0.01)
    step = session.apply("auto_optimize")
    assert step.ok, step.error
    model = session.module
    losses = {}
    for name, net in (("torch", reference), ("dcnb", model)):
        net.train()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        losses[name] = []
        for _ in range(5):
            optimizer.zero_grad()
            loss = F.cross_entropy(net(x), target)
            loss.backward()
            optimizer.step()
            losses[name].append(loss.item())
    assert losses["dcnb"][-1] < losses["dcnb"][0]
    assert losses["dcnb"] == pytest.approx(losses["torch"], rel=1e-4)
    for (name, p), q in zip(reference.state_dict().items(), ours.state_dict().values()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.timeout(300)
def test_vectorization_leaves_rows_that_hold_no_whole_vectors():
    # rows of 6 floats in vectors of 4: DaCe's Vectorization split the rest into a scalar map that matched again
    # forever, and its aligned vector loads crashed the process on the second row
    session = dcnb.optimize(torch.nn.SiLU(), torch.randn(3, 6), baselines=(), time_budget=0.01)
    assert _matches(session, "vectorization") == 0
    step = session.apply("vectorization", vector_len=4)
    assert not step.ok and "matches nothing" in step.error
    assert session.apply("vectorization", vector_len=2).ok  # rows of 6 hold whole vectors of 2
