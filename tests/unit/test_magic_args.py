"""%%dcoptimize's argument handling in a real IPython shell: every bad input is one paragraph, no traceback."""

import json

import pytest
from IPython.core.error import UsageError

from dcnb._src.magic import _snake, _split

MODULE = """
import torch
from torch import nn
class Doubler(nn.Module):
    def forward(self, x):
        return 2 * x
"""


def run(ip, line, cell=MODULE):
    """Run the magic as a cell does; returns the UsageError it raised."""
    with pytest.raises(UsageError) as raised:
        ip.run_cell_magic("dcoptimize", line, cell)
    return str(raised.value)


def test_help_documents_every_option(ip):
    doc = ip.find_cell_magic("dcoptimize").__doc__
    for option in ("--inputs", "--class", "--args", "--no-backward", "--training", "--device", "--recipe", "--as"):
        assert option in doc


def test_a_cell_without_a_module_is_told_so_and_its_definitions_stay(ip):
    message = run(ip, "--inputs torch.rand(2)", "kept = 41 + 1\n")
    assert message.startswith("The cell defines no torch.nn.Module subclass")
    assert ip.user_ns["kept"] == 42


def test_several_modules_need_class(ip):
    cell = MODULE + "class Tripler(nn.Module):\n    def forward(self, x):\n        return 3 * x\n"
    message = run(ip, "--inputs torch.rand(2)", cell)
    assert message == "The cell defines several nn.Module classes (Doubler, Tripler); choose one with --class NAME."
    assert "Doubler" in ip.user_ns and "Tripler" in ip.user_ns
    assert "no nn.Module subclass named Quadrupler" in run(ip, "--class Quadrupler --inputs torch.rand(2)", cell)


def test_missing_and_bad_inputs(ip):
    assert "Doubler needs example inputs: add --inputs EXPR" in run(ip, "")
    message = run(ip, '--inputs "torch.rand(2, nope)"')
    assert message == "--inputs 'torch.rand(2, nope)' does not evaluate: NameError: name 'nope' is not defined"
    assert "input 1 is a int; the example inputs must be torch tensors" in run(ip, "--inputs (torch.rand(2),3)")


def test_bad_constructor_arguments(ip):
    assert "Doubler(7) failed: TypeError" in run(ip, "--inputs torch.rand(2) --args 7")
    assert "--args '7,,' does not evaluate as call arguments" in run(ip, "--inputs torch.rand(2) --args 7,,")


def test_bad_options(ip, tmp_path):
    assert "not a Python identifier" in run(ip, "--inputs torch.rand(2) --as 2fast")
    assert "'eager' is not a baseline" in run(ip, "--inputs torch.rand(2) --baselines eager")
    missing = tmp_path / "missing.json"
    assert f"--recipe {missing}: cannot read it (No such file or directory)." == run(
        ip, f"--inputs torch.rand(2) --recipe {missing}"
    )
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "map_fusion"}))
    assert "is not a recipe" in run(ip, f"--inputs torch.rand(2) --recipe {bad}")
    with pytest.raises(UsageError, match="argument --device: invalid choice"):
        ip.run_cell_magic("dcoptimize", "--device tpu", MODULE)


def test_the_module_raising_on_its_inputs_is_one_paragraph(ip):
    # the session runs the module eagerly first: a shape mismatch is reported before anything is exported
    cell = MODULE.replace("return 2 * x", "return x @ torch.ones(3, 3)")
    message = run(ip, "--inputs torch.rand(2,4) --baselines ''", cell)
    assert message.startswith("Doubler: running Doubler on the example inputs failed: RuntimeError: mat1 and mat2")
    assert "\n" not in message


def test_a_cell_that_raises_shows_its_own_error_and_fails(ip, capsys):
    message = run(ip, "--inputs torch.rand(2)", "early = 1\nraise ValueError('mine')\n")
    assert message == "The cell raised an error (above), so there is nothing to optimize yet."
    assert "ValueError: mine" in capsys.readouterr().out
    assert ip.user_ns["early"] == 1


def test_variable_names_are_snake_case():
    assert _snake("Mish") == "mish"
    assert _snake("TinyMLP") == "tiny_mlp"
    assert _snake("BERTLayerNorm2d") == "bert_layer_norm2d"


def test_expressions_may_hold_spaces_or_quotes(ip):
    assert _split("--inputs torch.rand(2, 8) --args 'a b', c=[1, 2]  --as x") == [
        "--inputs", "torch.rand(2, 8)", "--args", "'a b',", "c=[1, 2]", "--as", "x"
    ]
    assert _split('--inputs "torch.rand(2, 8)" --baselines \'\'') == ["--inputs", "torch.rand(2, 8)", "--baselines", ""]
    cell = "class Scaled(nn.Module):\n    def __init__(self, a, b=1):\n        super().__init__()\n        assert b == 3\n"
    # the constructor runs with both arguments, then the module has no forward: the eager run names that
    message = run(ip, "--inputs torch.rand(2), torch.rand(3) --args 2, b=3", cell)
    assert message.startswith("Scaled: running Scaled on the example inputs failed")
