"""map_tiling and map_permutation (actions/tuners.py, what DaCe's cutout tuners tune) on real builds: each step is
correct, its maps tiled or reordered as asked, ``where`` applies it at one place, bad options name their cause, and a
search tries them with their options."""

import pytest
import torch
from dace import subsets
from dace.sdfg import nodes

import dcnb
from dcnb._src import search
from dcnb._src.passes import simd_loops
from dcnb._src.recipe import Entry
from tests.models import Mish
from tests.zoo import CASES

pytestmark = pytest.mark.compile

#: 2 * 4 * 64 * 64 = 32768 iterations a map, as many as run in parallel (schedule.GRAIN): enough to tile
SHAPE = (2, 4, 64, 64)


@pytest.fixture(scope="module")
def session() -> dcnb.Session:
    torch.manual_seed(0)
    return dcnb.optimize(Mish(), torch.rand(*SHAPE), baselines=("torch",), time_budget=0.05)


def _maps(sdfg) -> list[nodes.MapEntry]:
    """The maps as the actions left them: where the build made a map's last dimension an omp simd loop of its own
    (passes/simd_loops.py), the two as one map again."""
    found = []
    for node, state in sdfg.all_nodes_recursive():
        if not isinstance(node, nodes.MapEntry) or node.map.instrument == simd_loops.SIMD_LOOP:
            continue
        inner = [e.dst for e in state.out_edges(node) if isinstance(e.dst, nodes.MapEntry)]
        if inner and inner[0].map.instrument == simd_loops.SIMD_LOOP:
            ranges = subsets.Range([*node.map.range, *inner[0].map.range])
            node = nodes.MapEntry(nodes.Map(node.map.label, [*node.map.params, *inner[0].map.params], ranges))
        found.append(node)
    return found


def _ranges(entry: nodes.MapEntry) -> list[tuple[str, int, int]]:
    """Each dimension of a map: its parameter, its iterations (where constant, else the tile's) and its step."""
    return [(p, int(e - b + 1), int(s)) for p, (b, e, s) in zip(entry.map.params, entry.map.range)]


def _applied(session: dcnb.Session, name: str, **options) -> dcnb.Step:
    step = session.apply(name, **options)
    assert step.ok and step.check.ok, step.error
    return step


def test_map_tiling_tiles_the_innermost_dimensions_and_stays_correct(session):
    _applied(session, "map_tiling", size=16)
    try:
        for sdfg in (session.forward_sdfg, session.backward_sdfg):
            maps = _maps(sdfg)
            tiles = [m for m in maps if m.map.params[-2:] == ["tile___i2", "tile___i3"]]
            inner = [m for m in maps if m.map.params == ["__i2", "__i3"]]
            assert tiles and len(tiles) == len(inner) == len(maps) // 2
            # the parallel map: both leading dimensions whole, the last two in tiles of 16 ...
            assert all(_ranges(m) == [("__i0", 2, 1), ("__i1", 4, 1), ("tile___i2", 64, 16), ("tile___i3", 64, 16)]
                       for m in tiles)
            # ... around a map over one 16 x 16 tile
            assert all(_ranges(m) == [("__i2", 16, 1), ("__i3", 16, 1)] for m in inner)
    finally:
        session.undo()


def test_map_tiling_by_a_size_that_does_not_divide_the_rows(session):
    # 64 = 2 * 24 + 16: the last tile of each dimension is shorter (a Min in its range, which the build's
    # schedule pass reads in the backward's sums)
    _applied(session, "map_tiling", size=24)
    try:
        inner = [m for m in _maps(session.backward_sdfg) if m.map.params == ["__i2", "__i3"]]
        assert inner and all("Min(63, tile___i3 + 23)" in str(m.map.range) for m in inner)
    finally:
        session.undo()


def test_map_tiling_leaves_tiled_and_small_maps_alone(session):
    # a tiled map steps by its tiles: tiling again matches nothing; so do tiles as large as a dimension
    _applied(session, "map_tiling", size=16)
    try:
        assert next(a for a in session.actions() if a.name == "map_tiling").matches == 0
    finally:
        session.undo()
    step = session.apply("map_tiling", size=64)
    assert not step.ok and "matches nothing" in step.error and "more than 64 in its 2 innermost" in step.error


def test_map_tiling_where_tiles_one_map(session):
    places = session.places("map_tiling")  # at its default size, 32: the same maps as 16
    assert len(places) > 1
    place = places[0]
    step = session.apply("map_tiling", where=place.labels, size=16)
    try:
        assert step.ok and step.check.ok, step.error
        sdfg = session.forward_sdfg if place.side == "forward" else session.backward_sdfg
        tiled = [m for m in _maps(sdfg) if "tile___i3" in m.map.params]
        assert [m.map.label for m in tiled] == list(place.labels)
        assert session.recipe[-1] == {"name": "map_tiling", "options": {"size": 16}, "where": list(place.labels)}
    finally:
        session.undo()


def test_map_permutation_reorders_the_dimensions_as_asked(session):
    for options, order in (({}, ["__i1", "__i0", "__i2", "__i3"]), ({"order": (0, 1, 3, 2)}, ["__i0", "__i1", "__i3", "__i2"])):
        _applied(session, "map_permutation", **options)
        try:
            for sdfg in (session.forward_sdfg, session.backward_sdfg):
                maps = _maps(sdfg)
                assert maps and all(m.map.params == order for m in maps)
                sizes = dict(zip(["__i0", "__i1", "__i2", "__i3"], SHAPE))
                assert all(_ranges(m) == [(p, sizes[p], 1) for p in order] for m in maps)  # each range with its parameter
        finally:
            session.undo()


@pytest.mark.parametrize(
    "name,options,cause",
    [
        ("map_tiling", {"size": 1}, "map_tiling's size is the tile's length in each tiled dimension, a whole number of 2 or more, not 1"),
        ("map_tiling", {"size": "16"}, "a whole number of 2 or more, not '16'"),
        ("map_tiling", {"dims": 0}, "map_tiling's dims is how many innermost dimensions are tiled, a whole number of 1 or more, not 0"),
        ("map_tiling", {"tile": 16}, "map_tiling takes the options size and dims, not tile"),
        ("map_permutation", {"order": (0, 0, 1, 2)}, "each of 0 .. n-1 once"),
        ("map_permutation", {"order": "1023"}, "not '1023'"),
        ("map_permutation", {"axes": (1, 0)}, "map_permutation takes the option order, not axes"),
        ("map_fusion", {"size": 16}, "map_fusion takes the options "),
        ("auto_optimize", {"size": 16}, "auto_optimize takes no options, not size"),
        ("map_permutation", {"order": (1, 0, 2)}, "matches nothing in the forward or backward SDFG (no outermost map has 3 dimensions"),
    ],
)
def test_bad_options_name_their_cause(session, name, options, cause):
    before = session.history
    step = session.apply(name, **options)
    assert not step.ok and cause in step.error
    assert session.history[:-1] == before and session.current.ok


@pytest.mark.parametrize(
    "case,training,action,options",
    [
        pytest.param("mlp", False, "map_tiling", {"size": 16}, marks=pytest.mark.deep),
        # (in training mode small_net's maps of three dimensions or more were the ReLUs its BatchNorms now write)
        ("resnet_basic", True, "map_permutation", {}),
    ],
)
def test_the_zoo_stays_correct(case, training, action, options):
    module, inputs = CASES[case].build(bench=True)  # its benchmark size: maps large enough to tile
    session = dcnb.optimize(module, *inputs, training=training, baselines=(), time_budget=0.01)
    step = _applied(session, action, **options)
    params = {f"grad {n}" for n, p in module.named_parameters() if p.requires_grad}
    assert params <= set(step.check.errors)  # every gradient compared with PyTorch's, buffers too in training
    assert {f"buffer {n}" for n, _ in module.named_buffers()} <= set(step.check.errors)


def test_a_search_tries_them_with_their_options(session):
    # by default, each tile size worth trying once, the default order once
    wanted = search._entries(session, None)
    assert Entry("map_tiling", {"size": 16}) in wanted and Entry("map_tiling", {"size": 64}) in wanted
    assert Entry("map_permutation") in wanted and sum(e.name == "map_tiling" for e in wanted) == 2
    tries = [{"name": "map_tiling", "options": {"size": size}} for size in (16, 32, 64)] + ["map_permutation"]
    start = len(session.history)
    result = session.search(120, objective="memory", actions=tries, beam=1, depth=1)
    # 64 matches nothing in 64 x 64 rows, and is not tried
    titles = [c.title for c in result.candidates]
    assert titles == ["start", "map_tiling size=16", "map_tiling size=32", "map_permutation"]
    assert all(c.ok for c in result.candidates), [c.error for c in result.candidates]
    while len(session.history) > start:
        session.undo()
