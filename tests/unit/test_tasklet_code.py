"""Rewriting tasklets' code (passes/tasklet_code.py): symbol declarations in one order in every process."""

import concurrent.futures
import os
import subprocess
import sys

import dace
import pytest

from dcnb._src.passes import tasklet_code

# a C++ tasklet reading three symbols of a nested SDFG that simplify inlines, its symbols bound to constants
_INLINED = """
import warnings
warnings.simplefilter("ignore")
import dace
from dcnb._src.passes import tasklet_code
inner = dace.SDFG("sizes")
for name in ("M", "N", "K"):
    inner.add_symbol(name, dace.int64)
inner.add_array("out", [1], dace.int64)
state = inner.add_state()
tasklet = state.add_tasklet("sizes", {}, {"o"}, "o = M * 100 + N * 10 + K;", language=dace.Language.CPP)
state.add_edge(tasklet, "o", state.add_write("out"), None, dace.Memlet("out[0]"))
outer = dace.SDFG("outer")
outer.add_array("out", [1], dace.int64)
state = outer.add_state()
nested = state.add_nested_sdfg(inner, set(), {"out"}, symbol_mapping={"M": 3, "N": 2, "K": 1})
state.add_edge(nested, "out", state.add_write("out"), None, dace.Memlet("out[0]"))
outer.simplify()
tasklet = next(n for n, _ in outer.all_nodes_recursive() if isinstance(n, dace.nodes.Tasklet))
print(repr(tasklet.code.as_string))
tasklet_code.declarations_in_order(outer)
print(repr(tasklet.code.as_string))
"""


def _inlined(seed: int) -> tuple[str, str]:
    """The tasklet's code as inlined and then ordered, in a process of its own with this hash seed."""
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    out = subprocess.run([sys.executable, "-c", _INLINED], env=env, capture_output=True, text=True, check=True).stdout
    inlined, ordered = out.splitlines()
    return inlined, ordered


def test_inlined_symbols_are_declared_in_one_order_whatever_the_process():
    with concurrent.futures.ThreadPoolExecutor() as pool:  # the processes side by side
        inlined, ordered = zip(*pool.map(_inlined, (0, 1, 2)))
    # DaCe declares them in the order of a set of names: another order in another process
    assert len(set(inlined)) > 1
    assert set(ordered) == {repr("auto K = 1;\nauto M = 3;\nauto N = 2;\no = M * 100 + N * 10 + K;")}


@pytest.mark.parametrize(
    "code",
    [
        "auto __dacesym_N = M;\nauto M = N;\nauto N = __dacesym_N;\no = M - N;",  # DaCe's swap of M and N
        "auto b = next();\nauto a = next();\no = a - b;",
    ],
    ids=["reading-one-another", "calls"],
)
def test_declarations_whose_order_can_matter_keep_it(code):
    sdfg = dace.SDFG("kept")
    sdfg.add_array("out", [1], dace.int64)
    state = sdfg.add_state()
    tasklet = state.add_tasklet("kept", {}, {"o"}, code, language=dace.Language.CPP)
    state.add_edge(tasklet, "o", state.add_write("out"), None, dace.Memlet("out[0]"))
    assert tasklet_code.declarations_in_order(sdfg) == 0
    assert tasklet.code.as_string == code
