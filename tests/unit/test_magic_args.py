"""%%dcoptimize's argument handling in a real IPython shell: every bad input is one paragraph, no traceback."""

import json
import re

import pytest
import torch
from IPython.core.error import UsageError

from dcnb._src import cuda_check, magic
from dcnb._src.magic import _snake, _split
from dcnb._src.session import Session

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
    for option in ("--inputs", "--kwargs", "--class", "--args", "--no-backward", "--training", "--device", "--recipe", "--as",
                   "--cuda-arch", "--no-cuda-build"):
        assert option in doc


def module_cell(name: str, *body: str, init: str = "") -> str:
    """A cell that sets ``kept`` (line 1) and defines ``name`` (line 2), whose forward(self, x) starts on line 3 and
    whose body lines start on line 4."""
    lines = ["kept = True", f"class {name}(nn.Module):"]
    if init:
        lines += ["    def __init__(self):", "        super().__init__()", f"        {init}"]
    lines += ["    def forward(self, x):", *(f"        {b}" for b in body)]
    return "\n".join(lines) + "\n"


DOUBLER = module_cell("Doubler", "return 2 * x")
TWO = DOUBLER + "class Tripler(nn.Module):\n    def forward(self, x):\n        return 3 * x\n"
X = "--inputs torch.rand(2)"  # good inputs for DOUBLER: each row below gets one thing wrong
RECIPES = {  # {tmp}/<name>.json, written by the recipes fixture
    "bad_json": "[{",
    "not_a_recipe": json.dumps({"name": "map_fusion"}),
    "unknown_action": json.dumps([{"name": "fuse_everything"}]),
}

#: (id, magic line, cell, words the message holds): every bad input of %%dcoptimize
BAD_INPUTS = [
    # the options
    ("no inputs", "", DOUBLER, ["Doubler needs example inputs: add --inputs EXPR"]),
    ("--inputs without a value", "--inputs", DOUBLER, ["argument --inputs: expected at least one argument"]),
    ("--inputs does not evaluate", '--inputs "torch.rand(2, nope)"', DOUBLER,
     ["--inputs 'torch.rand(2, nope)' does not evaluate: NameError: name 'nope' is not defined"]),
    ("--inputs not tensors", "--inputs (torch.rand(2),3)", DOUBLER,
     ["input 1 is a int; the example inputs must be torch tensors"]),
    ("--inputs empty", "--inputs ()", DOUBLER, ["--inputs '()' gives no inputs", "at least one example tensor"]),
    ("--kwargs do not evaluate", f"{X} --kwargs mask=", DOUBLER, ["--kwargs 'mask=' does not evaluate as keyword arguments"]),
    ("--kwargs do not fit", f"{X} --kwargs mask=torch.ones(2)", DOUBLER, ["got an unexpected keyword argument 'mask'"]),
    ("--class unknown", f"{X} --class Quadrupler", TWO, ["--class Quadrupler", "no nn.Module subclass named Quadrupler"]),
    ("--class not a module", f"{X} --class torch", DOUBLER, ["no nn.Module subclass named torch"]),
    ("--class without a value", f"{X} --class", DOUBLER, ["argument --class: expected one argument"]),
    ("several modules, no --class", X, TWO, ["several nn.Module classes (Doubler, Tripler); choose one with --class"]),
    ("no module", X, "kept = True\n", ["The cell defines no torch.nn.Module subclass"]),
    ("--args do not evaluate", f"{X} --args 7,,", DOUBLER, ["--args '7,,' does not evaluate as call arguments"]),
    ("--args do not fit", f"{X} --args 7", DOUBLER, ["Doubler(7) failed: TypeError"]),
    ("--no-backward with a value", f"{X} --no-backward yes", DOUBLER, ["--no-backward takes no value (got 'yes')"]),
    ("--training with a value", f"{X} --training 1", DOUBLER, ["--training takes no value (got '1')"]),
    ("--device unknown", f"{X} --device tpu", DOUBLER, ["argument --device: invalid choice: 'tpu'"]),
    ("--device cuda without one", f"{X} --device cuda", DOUBLER, ["--device cuda: PyTorch sees no CUDA device"]),
    ("--recipe missing", f"{X} --recipe {{tmp}}/missing.json", DOUBLER, ["missing.json: cannot read it (No such file"]),
    ("--recipe not JSON", f"{X} --recipe {{tmp}}/bad_json.json", DOUBLER, ["bad_json.json is not JSON"]),
    ("--recipe not a recipe", f"{X} --recipe {{tmp}}/not_a_recipe.json", DOUBLER,
     ["not_a_recipe.json is not a recipe: a recipe is a list of steps"]),
    ("--recipe unknown action", f"{X} --recipe {{tmp}}/unknown_action.json", DOUBLER,
     ["step 1 is 'fuse_everything', which is not an action", "map_fusion"]),
    ("--as not a name", f"{X} --as 2fast", DOUBLER, ["--as 2fast: '2fast' is not a Python identifier"]),
    ("--as a keyword", f"{X} --as class", DOUBLER, ["'class' is a Python keyword"]),
    ("--as taken", f"{X} --as torch", DOUBLER, ["--as torch would replace torch (a module)", "choose another name"]),
    ("--baselines unknown", f"{X} --baselines eager", DOUBLER, ["--baselines: 'eager' is not a baseline; choose from torch"]),
    ("--time-budget not a number", f"{X} --time-budget soon", DOUBLER, ["--time-budget: invalid float value: 'soon'"]),
    ("--time-budget negative", f"{X} --time-budget -1", DOUBLER, ["--time-budget -1: give the seconds of timing per step"]),
    ("--time-budget nan", f"{X} --time-budget nan", DOUBLER, ["--time-budget nan: give the seconds"]),
    ("unknown option", f"{X} --bogus", DOUBLER, ["unrecognized arguments: --bogus", "%%dcoptimize? lists the options"]),
    ("--cuda-arch unknown", f"{X} --cuda-arch sm_75", DOUBLER,
     ["--cuda-arch 'sm_75' is not a CUDA architecture dcnb builds for; choose from sm_80, sm_86, sm_89, sm_90"]),
    ("--cuda-arch without a value", f"{X} --cuda-arch", DOUBLER, ["argument --cuda-arch: expected one argument"]),
    ("--no-cuda-build with a value", f"{X} --no-cuda-build yes", DOUBLER, ["--no-cuda-build takes no value (got 'yes')"]),
    # the module and its inputs
    ("too many inputs", "--inputs torch.rand(2), torch.rand(3)", DOUBLER,
     ["running Doubler on the example inputs failed: TypeError", "takes 2 positional arguments but 3 were given"]),
    ("inputs of the wrong shape", "--inputs torch.rand(2, 4)", module_cell("Matmul", "return x @ torch.ones(3, 3)"),
     ["running Matmul on the example inputs failed: RuntimeError: mat1 and mat2",
      "line 4: `return x @ torch.ones(3, 3)`"]),
    ("forward raises", X, module_cell("Raises", "raise ValueError('no forward today')"),
     ["running Raises on the example inputs failed: ValueError: no forward today",
      "line 4: `raise ValueError('no forward today')`"]),
    ("data-dependent branch", X, module_cell("Branch", "if x.sum() > 0:", "    return 2 * x", "return x"),
     ["Branch's forward depends on its data in Python", "line 4: `if x.sum() > 0:`", "into a Python bool",
      "export records one call", "torch.where"]),
    ("data-dependent value", X, module_cell("Scale", "return x / x.max().item()"),
     ["Scale's forward depends on its data", "line 4: `return x / x.max().item()`", "into a Python number"]),
    ("in-place op on an input", X, module_cell("Doubling", "x.mul_(2)", "return x"),
     ["Doubling writes into its input `x` in place (Tensor.mul_", "line 4: `x.mul_(2)`", "compute a new tensor"]),
    ("nothing to differentiate", "--inputs torch.arange(4)", module_cell("Indices", "return x * 2"),
     ["Indices has nothing to differentiate", "no parameter that requires a gradient", "--no-backward"]),
    ("the cell raises", X, "kept = True\nraise ValueError('mine')\n" + DOUBLER,
     ["The cell raised an error (above), so there is nothing to optimize yet."]),
]


@pytest.fixture(scope="module")
def recipes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("recipes")
    for name, text in RECIPES.items():
        (folder / f"{name}.json").write_text(text)
    return folder


@pytest.mark.parametrize("line, cell, words", [pytest.param(*row[1:], id=row[0]) for row in BAD_INPUTS])
def test_bad_input_is_one_paragraph_naming_its_cause(ip, capsys, recipes, line, cell, words):
    if "--device cuda" in line and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    line = line.replace("{tmp}", str(recipes))
    # every variable the cell could bind holds a session from an earlier %%dcoptimize
    earlier = Session.__new__(Session)
    earlier.__dict__["steps"] = ["naive"]
    names = {_snake(name) + "_opt" for name in re.findall(r"^class (\w+)", cell, re.MULTILINE)}
    chosen = re.search(r"--as (\S+)", line)
    if chosen and chosen.group(1).isidentifier() and chosen.group(1) not in ip.user_ns:
        names.add(chosen.group(1))
    for name in names:
        ip.user_ns[name] = earlier
    ip.user_ns.pop("kept", None)
    torch_module = ip.user_ns["torch"]
    capsys.readouterr()
    try:
        message = run(ip, line, cell)
        for w in words:
            assert w in message
        assert "\n" not in message and "Traceback" not in message
        if not message.startswith("The cell raised"):  # (whose own error is shown, as for any cell)
            shown = capsys.readouterr()
            assert "Traceback" not in shown.out + shown.err
            for name in re.findall(r"^class (\w+)", cell, re.MULTILINE):
                assert isinstance(ip.user_ns[name], type)
        assert ip.user_ns["kept"] is True  # the cell ran: its definitions stay
        assert all(ip.user_ns[name] is earlier for name in names) and earlier.__dict__ == {"steps": ["naive"]}
        assert ip.user_ns["torch"] is torch_module
    finally:
        for name in names:
            ip.user_ns.pop(name, None)


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


def test_the_cuda_build_options_reach_the_session(ip, monkeypatch):
    seen = {}
    monkeypatch.setattr(magic, "_build", lambda *args, **options: seen.update(options))
    ip.run_cell_magic("dcoptimize", f"{X} --cuda-arch sm_80 --no-cuda-build --as cuda_opt", DOUBLER)
    assert seen["cuda_arch"] == "sm_80" and seen["cuda_build"] is False
    ip.run_cell_magic("dcoptimize", f"{X} --as cuda_opt", DOUBLER)
    assert seen["cuda_arch"] is None and seen["cuda_build"] is None  # (sm_90; on unless DCNB_CUDA_BUILD=0)
    assert [cuda_check.arch(a) for a in ("sm_80", "86", "SM_89", " sm_90 ")] == ["80", "86", "89", "90"]
