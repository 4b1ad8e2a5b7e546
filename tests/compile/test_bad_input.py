"""Bad input after a real %%dcoptimize: the session bound before stays as it was; what a refusal suggests builds.

The bad inputs themselves, one row each, are tests/unit/test_magic_args.py's table (none of them needs a compile).
"""

import pytest
import torch
from IPython.core.error import UsageError

pytestmark = pytest.mark.compile

DOUBLER = """
class Doubler(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(2.0))
    def forward(self, x):
        return self.scale * x
"""
GOOD = "--inputs torch.rand(4, 8) --baselines '' --time-budget 0.05"


def _refused(ip, line, cell):
    with pytest.raises(UsageError) as raised:
        ip.run_cell_magic("dcoptimize", line, cell)
    message = str(raised.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_bad_cells_leave_the_earlier_session_at_its_last_good_state(ip):
    ip.run_cell_magic("dcoptimize", GOOD, DOUBLER)
    session = ip.user_ns["doubler_opt"]
    session.apply("map_fusion")  # a step past the naive one (applied or refused): the state to keep is the last good
    history, current, recipe = session.history, session.current, session.recipe
    bad = [
        # the same class name, so the same variable: redefined with a forward that raises, branches on data, ...
        (GOOD, DOUBLER.replace("return self.scale * x", "raise ValueError('broken')"), "ValueError: broken"),
        (GOOD, DOUBLER.replace("return self.scale * x", "return x if x.sum() > 0 else -x"), "a Python bool"),
        (GOOD, DOUBLER.replace("return self.scale * x", "x.mul_(self.scale)\n        return x"), "in place"),
        (GOOD.replace("torch.rand(4, 8)", "torch.rand(4, 8), torch.rand(2)"), DOUBLER, "positional arguments"),
        (GOOD + " --time-budget -2", DOUBLER, "--time-budget -2"),
        (GOOD + " --device tpu", DOUBLER, "invalid choice"),
    ]
    for line, cell, words in bad:
        assert words in _refused(ip, line, cell)
        assert ip.user_ns["doubler_opt"] is session
    assert session.history == history and session.current is current and session.recipe == recipe
    x = torch.rand(4, 8)
    torch.testing.assert_close(session.module(x), 2 * x)
    # the last cell (a good one, refused for its option) defined the class all the same
    assert ip.user_ns["Doubler"] is not type(session.module.module)


def test_a_module_with_nothing_to_differentiate_builds_forward_only(ip):
    cell = "class Indices(nn.Module):\n    def forward(self, i):\n        return i * 2 + 1\n"
    message = _refused(ip, "--inputs torch.arange(6) --baselines ''", cell)
    assert message.startswith("Indices has nothing to differentiate") and "--no-backward" in message
    assert "indices_opt" not in ip.user_ns
    # what the message suggests works
    ip.run_cell_magic("dcoptimize", "--inputs torch.arange(6) --no-backward --baselines '' --time-budget 0.05", cell)
    session = ip.user_ns["indices_opt"]
    assert session.current.ok and session.backward_sdfg is None
    torch.testing.assert_close(session.module(torch.arange(6)), torch.arange(6) * 2 + 1)
