"""Bad input and failing steps: a clear reason, and the session stays at its last good state."""

import pytest
import torch
from torch import nn
from dace import dtypes
from dace.codegen import cppunparse
from dace.properties import CodeBlock
from dace.sdfg import nodes

import dcnb
from dcnb._src import actions
from tests.models import Determinant, Mish, TinyMLP

pytestmark = pytest.mark.compile

SHAPE = (2, 4, 8, 8)


def _tasklets(sdfg):
    return [n for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nodes.Tasklet)]


def _raise(sdfg, where, options, device):
    raise RuntimeError("this transformation always fails")


def _scale_backward(sdfg, where, options, device):
    # only the backward has gradient arrays: outputs stay right, input gradients go wrong
    if not any(name.startswith("gradient_") for name in sdfg.arrays):
        return 0
    tasklet = _tasklets(sdfg)[-1]
    out = next(iter(tasklet.out_connectors))
    tasklet.code = CodeBlock(tasklet.code.as_string + f"\n{out} = {out} * 1.5", dtypes.Language.Python)
    return 1


def _break_cpp(sdfg, where, options, device):
    if any(name.startswith("gradient_") for name in sdfg.arrays):
        return 0
    _tasklets(sdfg)[0].code = CodeBlock("this is not C++;", dtypes.Language.CPP)
    return 1


def _disconnect(sdfg, where, options, device):
    """A tasklet's output connector left without its memlet: an SDFG DaCe's validation refuses."""
    if any(name.startswith("gradient_") for name in sdfg.arrays):
        return 0
    _tasklets(sdfg)[0].add_out_connector("unwritten")
    return 1


def _drift(sdfg, where, options, device):
    """Outputs right on a binary's first call and doubled from its second on: state a call leaves behind."""
    if any(name.startswith("gradient_") for name in sdfg.arrays):
        return 0
    state = next(s for s in sdfg.states() if any(isinstance(n, nodes.Tasklet) for n in s.nodes()))

    def written(tasklet):
        return sdfg.arrays[state.memlet_path(state.out_edges(tasklet)[0])[-1].data.data]

    tasklet = next(n for n in state.nodes() if isinstance(n, nodes.Tasklet) and not written(n).transient)
    out = next(iter(tasklet.out_connectors))
    elements = written(tasklet).total_size
    body = cppunparse.py2cpp(tasklet.code.as_string).removeprefix("auto ")  # the connector is declared already
    tasklet.code = CodeBlock(
        f"{body}\n"
        "static int calls = 0;\n"
        f"if (__atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED) >= {elements}) {out} = {out} * 2;",
        dtypes.Language.CPP,
    )
    return 1


@pytest.fixture
def broken_actions():
    added = [
        actions.Action("always_raises", "raises", False, lambda s, w, o: 1, _raise),
        actions.Action("wrong_gradients", "scales a gradient", False, lambda s, w, o: 1, _scale_backward),
        actions.Action("bad_code", "writes invalid C++", False, lambda s, w, o: 1, _break_cpp),
        actions.Action("drifting", "leaves state behind", False, lambda s, w, o: 1, _drift),
        actions.Action("disconnecting", "leaves an output unwritten", False, lambda s, w, o: 1, _disconnect),
    ]
    for action in added:
        actions.register(action)
    yield
    for action in added:
        del actions.REGISTRY[action.name]


@pytest.fixture
def session():
    return dcnb.optimize(Mish(), torch.rand(*SHAPE), baselines=(), time_budget=0.05)


def _assert_rolled_back(session, before, step):
    assert not step.ok
    assert session.current is before
    assert session.history[-1] is step
    assert session.recipe == []
    torch.testing.assert_close(session.module(torch.zeros(*SHAPE)), torch.zeros(*SHAPE))


def test_a_raising_transformation_is_recorded_and_rolled_back(session, broken_actions):
    before = session.current
    step = session.apply("always_raises")
    assert step.error == "always_raises raised RuntimeError: this transformation always fails"
    _assert_rolled_back(session, before, step)


def test_a_transformation_that_breaks_gradients_is_rolled_back(session, broken_actions):
    before = session.current
    step = session.apply("wrong_gradients")
    assert "breaks correctness: grad x differs from PyTorch" in step.error
    _assert_rolled_back(session, before, step)


def test_a_transformation_whose_results_change_from_call_to_call_is_rolled_back(session, broken_actions):
    # the check runs each new binary twice: what one call leaves behind shows on the next
    before = session.current
    step = session.apply("drifting")
    assert step.error is not None and "drifting breaks correctness" in step.error
    _assert_rolled_back(session, before, step)


def test_a_compile_failure_keeps_the_compiler_log(session, broken_actions):
    before = session.current
    step = session.apply("bad_code")
    assert step.error.startswith("the generated code does not compile:")
    assert "this is not C++" in step.log
    _assert_rolled_back(session, before, step)
    assert session.apply("tasklet_fusion").ok  # the session goes on from its last good state


def test_a_transformation_that_leaves_an_invalid_sdfg_names_what_is_invalid(
    session, broken_actions, tmp_path, monkeypatch
):
    # validated where its build fails: DaCe's code generation refuses it in the compile's process
    before = session.current
    monkeypatch.chdir(tmp_path)
    step = session.apply("disconnecting")
    assert step.error.startswith("disconnecting left an invalid SDFG: InvalidSDFGNodeError"), step.error
    assert "unwritten" in step.error
    _assert_rolled_back(session, before, step)
    assert list(tmp_path.iterdir()) == []  # DaCe saved the SDFG into _dacegraphs/ in the working directory


def test_an_action_that_matches_nothing_fails_with_its_reason(session):
    step = session.apply("expand")
    assert not step.ok and step.error == "expand matches nothing in the forward or backward SDFG"


def test_unknown_action_names_the_choices(session):
    with pytest.raises(KeyError, match="the actions are: expand, map_fusion"):
        session.apply("fuse_everything")


def test_wrong_input_shape_names_the_shapes():
    with pytest.raises(dcnb.InputError, match=r"running TinyMLP on the example inputs failed: RuntimeError: .*8 and 16x16"):
        dcnb.optimize(TinyMLP(width=16), torch.rand(4, 8))


class _MarksItsInput(nn.Module):
    def forward(self, x):
        h = x[:, None]
        h.requires_grad = True  # as Wav2Vec2's feature encoder does, for gradient checkpointing
        return torch.tanh(h)


def test_a_module_refusing_inputs_that_require_gradients_is_told_how_to_build_it():
    with pytest.raises(dcnb.InputError, match=r"requiring gradients .* failed: RuntimeError: you can only change "):
        dcnb.optimize(_MarksItsInput(), torch.rand(2, 5), baselines=(), time_budget=0.01)
    session = dcnb.optimize(_MarksItsInput(), torch.rand(2, 5), backward=False, baselines=(), time_budget=0.01)
    assert session.current.ok and session.current.check.ok


def test_unsupported_op_names_the_op_and_the_torch_call():
    with pytest.raises(dcnb.UnsupportedOpError) as raised:
        dcnb.optimize(Determinant(), torch.rand(3, 3))
    assert raised.value.op == "Det"
    assert "DaCe has no implementation of the ONNX op Det, which comes from `return torch.det(x)`" in str(raised.value)
    assert "models.py" in raised.value.source


class _RunningMaximum(nn.Module):
    def forward(self, x):
        return torch.cummax(x, dim=1).values


def test_an_op_pytorch_cannot_export_names_the_torch_call_and_prints_nothing(capfd):
    # PyTorch's exporter printed the whole TorchScript graph to the process' stdout (the cell's output) first
    with pytest.raises(dcnb.UnsupportedOpError) as raised:
        dcnb.optimize(_RunningMaximum(), torch.rand(3, 4))
    assert raised.value.op == "aten::cummax"
    assert "PyTorch cannot export aten::cummax of _RunningMaximum to ONNX (opset 18), which comes from " in str(
        raised.value
    )
    assert "`return torch.cummax(x, dim=1).values` (test_failures.py:" in str(raised.value)
    captured = capfd.readouterr()
    assert "graph" not in captured.out + captured.err


class _FarFromZero(nn.Module):
    """A training BatchNorm over four values 300 from zero and 0.01 apart: float32 keeps three digits of them."""

    def __init__(self):
        super().__init__()
        self.norm, self.linear = nn.BatchNorm1d(3), nn.Linear(5, 5)

    def forward(self, x):
        return self.norm(self.linear(x) + 300.0)


def test_an_ill_conditioned_gradient_is_judged_against_float64():
    # the weight's gradient: PyTorch's float32 is as far from the float64 one as dcnb's is from PyTorch's, past any
    # fixed tolerance (MobileViT's naive step was refused so)
    torch.manual_seed(0)
    session = dcnb.optimize(_FarFromZero(), torch.randn(4, 3, 5) * 0.01, training=True, baselines=(), time_budget=0.01)
    assert session.current.ok and session.current.check.ok
    assert session.current.check.errors["grad norm.weight"] > 1e-4


def test_a_refusal_names_the_node_by_its_module_path():
    # DaCe's name for the node was SLASH1SLASHDropout
    module = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
    with pytest.raises(dcnb.DcnbError) as raised:
        dcnb.optimize(module, torch.randn(4, 8), training=True, baselines=(), time_budget=0, cuda_build=False)
    assert "1 · Dropout drops values in training mode" in str(raised.value)
    assert "SLASH" not in str(raised.value) and "DOT" not in str(raised.value)


def test_not_a_module_or_no_inputs():
    with pytest.raises(dcnb.InputError, match="torch.nn.Module"):
        dcnb.optimize(lambda x: x, torch.rand(2))
    with pytest.raises(dcnb.InputError, match="needs example inputs"):
        dcnb.optimize(Mish())
