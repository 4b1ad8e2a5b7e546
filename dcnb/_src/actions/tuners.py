"""map_tiling and map_permutation: what DaCe's cutout tuners tune (``dace.optimization``), as actions.

DaCe's ``MapTilingTuner`` and ``MapPermutationTuner`` cut each outermost map out of the SDFG, time it alone under
each configuration of their space (tile sizes; orders of the map's dimensions) and keep the fastest. A search here
builds, checks against PyTorch and times whole candidates instead (``search.py``), so what is taken from them is the
transformations and their option spaces, through DaCe's own transformations: ``MapTiling`` and ``MapDimShuffle``
(what the permutation tuner does to a map's parameters and ranges, tile sizes kept with them).

- ``map_tiling(size=32, dims=2)`` tiles the ``dims`` innermost dimensions of each outermost map by ``size``: the map
  becomes a parallel map over the leading dimensions and the tiles, around a sequential map over one tile (a
  ``size`` x ``size`` block of a matrix, which a transpose then reads and writes within cache). A map is tiled where
  it has enough iterations to run in parallel (``schedule.GRAIN``) and one of those dimensions more than ``size``; a
  dimension with fewer is left whole in the tile. Maps whose ranges are symbolic or step by more than one (tiled
  already, vectorized) are left alone.
- ``map_permutation(order=...)`` reorders the dimensions of each outermost map with as many dimensions as ``order``
  has entries, as ``numpy.transpose``'s axes: ``(1, 0, 2)`` makes the second dimension outermost. Without ``order``
  it swaps the two outermost dimensions of every map of three or more (the innermost, the one rows are contiguous
  along, stays innermost): which dimensions the parallel loop shares among threads, and in what order the rows are
  walked. A map's iterations are independent, so any order computes the same.

Both act after autodiff, on the forward and the backward, on CPU only: on a GPU the outermost map is the kernel's grid
(DaCe's MapTiling would nest a second GPU map in it; a GPU's tiles are thread blocks, ``cuda_build.size_blocks``).

Data layouts (DaCe's ``DataLayoutTuner``, which changes the strides of a cutout's arrays) are not an action: the
inputs, outputs and parameters are PyTorch's tensors, with PyTorch's strides; an intermediate's layout is shared by
the forward that stores it and the backward that reads it, by the views that reinterpret its memory (reshapes,
flattening) and by the nested SDFGs and library nodes (matrix products, convolutions) that were given its strides
when they were expanded or that call a BLAS expecting its own. Changing strides correctly means finding and
changing all of those together; the maps between them already walk arrays in the order they are stored.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence

import dace
from dace.sdfg import nodes
from dace.transformation.dataflow import MapDimShuffle, MapTiling

from ..errors import check
from ..passes.schedule import GRAIN, _extent, _inside_map
from . import matching
from .matching import Where

#: map_tiling's options when not given: 32 x 32 floats (4 KiB) a tile, two in L1 with room to spare
TILE_SIZE = 32
TILE_DIMS = 2


def _outermost(sdfg: dace.SDFG, where: Where) -> Iterator[tuple[nodes.MapEntry, dace.SDFGState]]:
    """The outermost maps of ``sdfg`` (those of nested SDFGs outside maps too: inside one, a map is a loop of the
    map around it) named by ``where``."""
    for node, state in sdfg.all_nodes_recursive():
        if not isinstance(node, nodes.MapEntry) or state.entry_node(node) is not None or _inside_map(state.sdfg):
            continue
        if where is None or matching.label(node) in where:
            yield node, state


def _extents(entry: nodes.MapEntry) -> list[int] | None:
    """Iterations of each dimension of a map whose ranges are constants stepping by one, else None."""
    ranges = list(entry.map.range)
    if not all(getattr(v, "is_Integer", isinstance(v, int)) for r in ranges for v in r):
        return None
    if any(int(step) != 1 for _, _, step in ranges):
        return None
    return [_extent(r) for r in ranges]


# --- map_tiling -------------------------------------------------------------------------------------------------


def _tiling_options(options: dict) -> tuple[int, int]:
    size, dims = options.get("size", TILE_SIZE), options.get("dims", TILE_DIMS)
    check(
        isinstance(size, int) and not isinstance(size, bool) and size >= 2,
        f"map_tiling's size is the tile's length in each tiled dimension, a whole number of 2 or more, not {size!r}",
    )
    check(
        isinstance(dims, int) and not isinstance(dims, bool) and dims >= 1,
        f"map_tiling's dims is how many innermost dimensions are tiled, a whole number of 1 or more, not {dims!r}",
    )
    return size, dims


def _tile_sizes(extents: list[int], size: int, dims: int) -> tuple[int, ...] | None:
    """MapTiling's tile sizes for a map of ``extents``: the leading dimensions of one (each moves whole to the map
    of tiles), ``size`` for each of the ``dims`` innermost with more than ``size`` iterations, the whole extent
    for those with fewer (left whole in the tile); None where no dimension has more than ``size``, or where the map
    has too few iterations to run in parallel (``schedule.GRAIN``): it runs on one thread, where tiles gain nothing,
    and its tiles, loops inside a map, would make it parallel."""
    inner = extents[-dims:]
    if not any(n > size for n in inner) or math.prod(extents) < GRAIN:
        return None
    return (1,) * (len(extents) - len(inner)) + tuple(size if n > size else n for n in inner)


def _tilable(sdfg: dace.SDFG, where: Where, options: dict) -> list[tuple[nodes.MapEntry, dace.SDFGState, tuple]]:
    size, dims = _tiling_options(options)

    def sizes(entry: nodes.MapEntry) -> tuple | None:
        extents = _extents(entry)
        return None if extents is None else _tile_sizes(extents, size, dims)

    return _chosen(sdfg, where, sizes)


def tiling_places(sdfg: dace.SDFG, where: Where, options: dict) -> list[nodes.MapEntry]:
    return _entries(_tilable(sdfg, where, options))


def tiling_count(sdfg: dace.SDFG, where: Where, options: dict) -> int:
    return len(tiling_places(sdfg, where, options))


def tile(sdfg: dace.SDFG, where: Where, options: dict) -> int:
    """Tile each map ``tiling_places`` finds with DaCe's MapTiling; returns how many."""
    found = _tilable(sdfg, where, options)
    for entry, state, sizes in found:
        extents = _extents(entry)
        even = all(n % s == 0 for n, s in zip(extents, sizes))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # MapTiling annotates the memlets it changes itself (annotate=False skips propagating the whole SDFG)
            MapTiling.apply_to(
                state.sdfg,
                options={"tile_sizes": sizes, "divides_evenly": even},
                annotate=False,
                save=False,
                map_entry=entry,
            )
    return len(found)


def tiling_reasons(sdfg: dace.SDFG, where: Where, options: dict) -> list[str]:
    """Why no map was tiled (for "matches nothing")."""
    size, dims = _tiling_options(options)
    maps = list(_outermost(sdfg, where))
    if not maps:
        return ["no outermost map" + ("" if where is None else " named in where")]
    if not any(_extents(e) is not None for e, _ in maps):
        return ["every outermost map has symbolic ranges or steps of more than one (tiled or vectorized already)"]
    return [
        f"no outermost map has {GRAIN} iterations or more and more than {size} in its {dims} innermost dimension(s)"
    ]


# --- map_permutation ------------------------------------------------------------------------------------------


def _order(options: dict) -> tuple[int, ...] | None:
    order = options.get("order")
    if order is None:
        return None
    ints = isinstance(order, Sequence) and not isinstance(order, str)
    ints = ints and all(isinstance(i, int) and not isinstance(i, bool) for i in order)
    check(
        ints and sorted(order) == list(range(len(order))) and len(order) >= 2,
        f"map_permutation's order is a map's dimensions in their new order, each of 0 .. n-1 once (n of 2 or "
        f"more, as numpy.transpose's axes: (1, 0, 2)), not {order!r}",
    )
    return tuple(order)


def _permutation(dims: int, order: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The order for a map of ``dims`` dimensions, or None where it is left alone."""
    if order is None:  # the two outermost swapped, the innermost left where it is
        return (1, 0, *range(2, dims)) if dims >= 3 else None
    if len(order) != dims or order == tuple(range(dims)):
        return None
    return order


def _permutable(sdfg: dace.SDFG, where: Where, options: dict) -> list[tuple[nodes.MapEntry, dace.SDFGState, tuple]]:
    order = _order(options)
    return _chosen(sdfg, where, lambda entry: _permutation(len(entry.map.params), order))


def _chosen(
    sdfg: dace.SDFG, where: Where, choose: Callable[[nodes.MapEntry], tuple | None]
) -> list[tuple[nodes.MapEntry, dace.SDFGState, tuple]]:
    """Each outermost map with what ``choose`` picks for it (its tile sizes, its order), where it picks one."""
    found = []
    for entry, state in _outermost(sdfg, where):
        choice = choose(entry)
        if choice is not None:
            found.append((entry, state, choice))
    return found


def permutation_places(sdfg: dace.SDFG, where: Where, options: dict) -> list[nodes.MapEntry]:
    return _entries(_permutable(sdfg, where, options))


def permutation_count(sdfg: dace.SDFG, where: Where, options: dict) -> int:
    return len(permutation_places(sdfg, where, options))


def _entries(found: list[tuple[nodes.MapEntry, dace.SDFGState, tuple]]) -> list[nodes.MapEntry]:
    """The map entries of what ``_tilable`` or ``_permutable`` found."""
    return [entry for entry, _, _ in found]


def permute(sdfg: dace.SDFG, where: Where, options: dict) -> int:
    """Reorder each map ``permutation_places`` finds with DaCe's MapDimShuffle; returns how many."""
    found = _permutable(sdfg, where, options)
    for entry, state, order in found:
        params = [entry.map.params[i] for i in order]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            MapDimShuffle.apply_to(state.sdfg, options={"parameters": params}, annotate=False, save=False,
                                   map_entry=entry)
    return len(found)  # the memlets around a map are the same boxes whatever its order: none to propagate


def permutation_reasons(sdfg: dace.SDFG, where: Where, options: dict) -> list[str]:
    order = _order(options)
    if order is None:
        return ["no outermost map has three or more dimensions (the innermost stays innermost)"]
    return [f"no outermost map has {len(order)} dimensions" + ("" if where is None else " among those named in where")]
