"""A parallel map's dimensions in its arrays' memory order (passes/memory_order.py): over channels-last images the
channel dimension goes innermost; a map over arrays of the default layout, or over arrays that disagree, keeps its
order."""

import dace
from dace.sdfg import nodes

from dcnb._src.actions.layout import channels_last_strides
from dcnb._src.fixes.cpp import memory_loops
from dcnb._src.passes import memory_order

SHAPE = (2, 8, 5, 6)


def _scale(strides_a: tuple | None, strides_b: tuple | None, read: str = "a[n, c, h, w]") -> dace.SDFG:
    """One map over (n, c, h, w) writing b from ``read`` of a, the two arrays laid out by the strides given."""
    sdfg = dace.SDFG("scale")
    sdfg.add_array("a", SHAPE, dace.float32, strides=strides_a)
    sdfg.add_array("b", SHAPE, dace.float32, strides=strides_b)
    state = sdfg.add_state()
    ranges = {p: f"0:{n}" for p, n in zip("nchw", SHAPE)}
    state.add_mapped_tasklet(
        "scale", ranges, {"x": dace.Memlet(read)}, "y = x * 2", {"y": dace.Memlet("b[n, c, h, w]")},
        external_edges=True,
    )
    return sdfg


def _params(sdfg: dace.SDFG) -> list[str]:
    (entry,) = [n for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nodes.MapEntry)]
    return list(entry.map.params)


def test_over_channels_last_images_the_channels_go_innermost():
    last = channels_last_strides(SHAPE)
    sdfg = _scale(last, last)
    ranges_before = {p: r for p, r in zip(_params(sdfg), next(
        n.map.range for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nodes.MapEntry)))}
    assert memory_order.apply(sdfg) == 1
    assert _params(sdfg) == ["n", "h", "w", "c"]
    (entry,) = [n for n, _ in sdfg.all_nodes_recursive() if isinstance(n, nodes.MapEntry)]
    assert dict(zip(entry.map.params, entry.map.range)) == ranges_before
    sdfg.validate()


def test_a_map_over_the_default_layout_or_over_arrays_that_disagree_keeps_its_order():
    default = _scale(None, None)
    assert memory_order.apply(default) == 0 and _params(default) == ["n", "c", "h", "w"]
    mixed = _scale(channels_last_strides(SHAPE), None)
    assert memory_order.apply(mixed) == 0 and _params(mixed) == ["n", "c", "h", "w"]
    # an order chosen for arrays of the default layout (map_permutation's) is left as it is
    permuted = _scale(None, None)
    (entry,) = [n for n, _ in permuted.all_nodes_recursive() if isinstance(n, nodes.MapEntry)]
    entry.map.params = ["n", "c", "w", "h"]
    entry.map.range = dace.subsets.Range([entry.map.range[i] for i in (0, 1, 3, 2)])
    assert memory_order.apply(permuted) == 0 and _params(permuted) == ["n", "c", "w", "h"]


def test_an_array_broadcast_along_the_channels_does_not_stop_it():
    # a per-image value (SE blocks' scale is (N, C, 1, 1); here one per (n, h, w)) moves by 0 along c
    last = channels_last_strides(SHAPE)
    sdfg = _scale(last, last, read="a[n, 0, h, w]")
    assert memory_order.apply(sdfg) == 1 and _params(sdfg) == ["n", "h", "w", "c"]


def test_loops_written_in_memory_order_put_the_channels_of_a_channels_last_image_innermost():
    sdfg = _scale(channels_last_strides(SHAPE), None)
    head, _ = memory_loops(["n", "c", "h", "w"], sdfg.arrays["a"])
    assert [line.split()[3] for line in head.splitlines()] == ["n", "h", "w", "c"]
    head, _ = memory_loops(["n", "c", "h", "w"], sdfg.arrays["b"])
    assert [line.split()[3] for line in head.splitlines()] == ["n", "c", "h", "w"]
    symbolic = dace.data.Array(dace.float32, (dace.symbol("N"), 8), strides=(1, dace.symbol("N")))
    head, _ = memory_loops(["i", "j"], symbolic)  # strides unknown until run: the shape's order
    assert [line.split()[3] for line in head.splitlines()] == ["i", "j"]
