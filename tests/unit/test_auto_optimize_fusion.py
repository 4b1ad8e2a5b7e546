"""The map fusion that opens dcnb's auto_optimize fuses what DaCe's FullMapFusion fuses, without walking the graph
for every pair of maps (passes/auto_optimize.py)."""

import dace
import pytest
from dace.sdfg import nodes
from dace.transformation.dataflow import map_fusion_helper
from dace.transformation.passes import FullMapFusion

from dcnb._src.passes import auto_optimize

N = 64


def _maps(sdfg: dace.SDFG) -> int:
    return sum(isinstance(n, nodes.MapEntry) for n, _ in sdfg.all_nodes_recursive())


def _fan(count: int) -> dace.SDFG:
    """``count`` maps over the same range, each reading ``a`` and writing an output of its own: all parallel."""
    sdfg = dace.SDFG("fan")
    sdfg.add_array("a", [N], dace.float32)
    state = sdfg.add_state()
    source = state.add_access("a")
    for k in range(count):
        sdfg.add_array(f"b{k}", [N], dace.float32)
        state.add_mapped_tasklet(
            f"m{k}", {"i": f"0:{N}"}, {"x": dace.Memlet("a[i]")}, f"y = x * {k + 2}",
            {"y": dace.Memlet(f"b{k}[i]")}, external_edges=True, input_nodes={"a": source},
        )
    return sdfg


def _chain(count: int) -> dace.SDFG:
    """``count`` maps over the same range, each reading the previous one's output one element further on: none
    parallel to another, none fusable with the next."""
    sdfg = dace.SDFG("chain")
    sdfg.add_array("a0", [N], dace.float32)
    state = sdfg.add_state()
    previous = state.add_access("a0")
    for k in range(1, count + 1):
        sdfg.add_array(f"a{k}", [N], dace.float32)
        out = state.add_access(f"a{k}")
        state.add_mapped_tasklet(
            f"m{k}", {"i": f"0:{N - 1}"}, {"x": dace.Memlet(f"a{k - 1}[i + 1]")}, "y = x + 1",
            {"y": dace.Memlet(f"a{k}[i]")}, external_edges=True,
            input_nodes={f"a{k - 1}": previous}, output_nodes={f"a{k}": out},
        )
        previous = out
    return sdfg


@pytest.mark.parametrize("build", [_fan, _chain])
def test_fuses_what_full_map_fusion_fuses(build):
    ours, theirs = build(6), build(6)
    auto_optimize.fuse_maps(ours)
    FullMapFusion(strict_dataflow=True).apply_pass(theirs, {})
    ours.validate()
    assert _maps(ours) == _maps(theirs)
    assert _maps(ours) == (1 if build is _fan else 6)


def test_maps_that_cannot_be_parallel_are_not_walked(monkeypatch):
    walks = []
    walk = map_fusion_helper.is_node_reachable_from

    def counted(*args, **kwargs):
        walks.append(1)
        return walk(*args, **kwargs)

    monkeypatch.setattr(map_fusion_helper, "is_node_reachable_from", counted)
    FullMapFusion(strict_dataflow=True, perform_horizontal_map_fusion=False).apply_pass(_chain(20), {})
    vertical = len(walks)
    walks.clear()
    auto_optimize.fuse_maps(_chain(20))
    assert len(walks) == vertical
    # DaCe's horizontal fusion walks every pair of the 20 maps at least once: the cost this avoids
    walks.clear()
    FullMapFusion(strict_dataflow=True).apply_pass(_chain(20), {})
    assert len(walks) >= vertical + 20 * 19 // 2


def test_dace_prints_no_progress_into_the_cells_output():
    import dcnb  # noqa: F401

    assert dace.Config.get_bool("progress") is False
