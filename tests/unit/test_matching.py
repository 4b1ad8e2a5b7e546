"""Applying a transformation wherever it matches: in rounds, each place tested once a round (matching.py)."""

import dace
import numpy as np
from dace.sdfg import nodes, propagation
from dace.transformation.dataflow import MapFusion
from dace.transformation.optimizer import Optimizer

from dcnb._src.actions import matching

N = 32


def _chains(length: int) -> dace.SDFG:
    """Two chains of ``length`` maps: in the first each reads its input one element further on (no two fuse), in
    the second each reads its input where it was written (all fuse into one)."""
    sdfg = dace.SDFG("chains")
    state = sdfg.add_state()
    for chain, shift in (("s", 1), ("f", 0)):
        sdfg.add_array(f"{chain}0", [N], dace.float32)
        previous = state.add_access(f"{chain}0")
        for k in range(1, length + 1):
            sdfg.add_array(f"{chain}{k}", [N], dace.float32, transient=k < length)
            out = state.add_access(f"{chain}{k}")
            state.add_mapped_tasklet(
                f"{chain}m{k}", {"i": f"0:{N - shift}"}, {"x": dace.Memlet(f"{chain}{k - 1}[i + {shift}]")},
                "y = x + 1", {"y": dace.Memlet(f"{chain}{k}[i]")}, external_edges=True,
                input_nodes={f"{chain}{k - 1}": previous}, output_nodes={f"{chain}{k}": out},
            )
            previous = out
    return sdfg


def _maps(sdfg: dace.SDFG) -> int:
    return sum(isinstance(n, nodes.MapEntry) for n, _ in sdfg.all_nodes_recursive())


def test_rounds_fuse_what_repeating_fuses_testing_each_place_once_a_round(calls):
    tests = calls(MapFusion, "can_be_applied")
    theirs, ours = _chains(10), _chains(10)
    repeated = 0  # what the steps did before: match again from the start after every fusion
    while (match := next(Optimizer(theirs).get_pattern_matches(patterns=[MapFusion]), None)) is not None:
        match.apply_pattern(append=False)
        repeated += 1
    repeated_tests = len(tests)
    tests.clear()
    rounds = matching.apply_in_rounds(lambda: Optimizer(ours).get_pattern_matches(patterns=[MapFusion]))
    assert rounds == repeated == 9
    assert _maps(ours) == _maps(theirs) == 11
    # matching again from the start after every fusion tests the refused chain's places before each fusion
    assert len(tests) < repeated_tests / 2
    ours.validate()
    arrays = {f"{c}{k}": np.zeros(N, np.float32) for c in "sf" for k in (0, 10)}
    arrays["f0"][:] = np.arange(N)
    ours(**arrays)
    np.testing.assert_array_equal(arrays["f10"], np.arange(N) + 10)


def _memlets(sdfg: dace.SDFG) -> list[str]:
    return sorted(f"{e.src} -> {e.dst}: {e.data}" for e, _ in sdfg.all_edges_recursive())


def test_memlets_are_propagated_once_after_the_last_match_and_come_out_as_after_each(calls):
    theirs, ours = _chains(10), _chains(10)
    matching.apply_in_rounds(lambda: Optimizer(theirs).get_pattern_matches(patterns=[MapFusion]))  # after each
    propagations = calls(propagation, "propagate_memlets_sdfg", matching)
    applied = matching.apply_in_rounds_then_propagate(
        ours, lambda: Optimizer(ours).get_pattern_matches(patterns=[MapFusion])
    )
    assert applied == 9
    assert len(propagations) == 1
    assert _memlets(ours) == _memlets(theirs)


def _wiring(sdfg: dace.SDFG) -> list[str]:
    return sorted(f"{e.src}.{e.src_conn} -> {e.dst}.{e.dst_conn}: {e.data}" for e, _ in sdfg.all_edges_recursive())


def test_a_map_fusion_that_cannot_merge_inputs_does_not_propagate_the_fused_map(calls):
    theirs, ours = _chains(10), _chains(10)
    matching.apply_in_rounds(
        lambda: Optimizer(theirs).get_pattern_matches(patterns=[MapFusion]),
        lambda match: match.apply_pattern(append=False, annotate=False),
    )
    propagations = calls(propagation, "propagate_memlets_map_scope")
    applied = matching.apply_in_rounds(
        lambda: Optimizer(ours).get_pattern_matches(patterns=[MapFusion]), matching.apply_unpropagated
    )
    assert applied == 9
    assert propagations == []
    assert _wiring(ours) == _wiring(theirs)


def _two_reads() -> dace.SDFG:
    """t[i] = x[i] * 2, then y[i] = t[i] + x[i + 1]: fused, the map reads x through one connector, x[0:N]."""
    sdfg = dace.SDFG("two_reads")
    state = sdfg.add_state()
    sdfg.add_array("x", [N], dace.float32)
    sdfg.add_array("t", [N - 1], dace.float32, transient=True)
    sdfg.add_array("y", [N - 1], dace.float32)
    x, t = state.add_access("x"), state.add_access("t")
    state.add_mapped_tasklet(
        "double", {"i": f"0:{N - 1}"}, {"a": dace.Memlet("x[i]")}, "b = a * 2", {"b": dace.Memlet("t[i]")},
        external_edges=True, input_nodes={"x": x}, output_nodes={"t": t},
    )
    state.add_mapped_tasklet(
        "add", {"i": f"0:{N - 1}"}, {"a": dace.Memlet("t[i]"), "c": dace.Memlet("x[i + 1]")}, "b = a + c",
        {"b": dace.Memlet("y[i]")}, external_edges=True, input_nodes={"t": t, "x": x},
    )
    return sdfg


def test_a_map_fusion_that_merges_inputs_still_widens_their_memlet(calls):
    theirs, ours = _two_reads(), _two_reads()
    next(Optimizer(theirs).get_pattern_matches(patterns=[MapFusion])).apply_pattern(append=False, annotate=False)
    propagations = calls(propagation, "propagate_memlets_map_scope")
    matching.apply_unpropagated(next(Optimizer(ours).get_pattern_matches(patterns=[MapFusion])))
    assert len(propagations) == 1
    assert _wiring(ours) == _wiring(theirs)
    assert [str(e.data.subset) for e in ours.start_state.edges() if e.data.data == "x" and e.src_conn is None] == [
        f"0:{N}"
    ]
    ours.validate()
    x, y = np.arange(N, dtype=np.float32), np.zeros(N - 1, np.float32)
    ours(x=x, y=y)
    np.testing.assert_array_equal(y, x[:-1] * 2 + x[1:])
