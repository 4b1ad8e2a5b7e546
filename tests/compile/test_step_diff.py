"""What a step changed, as the views mark it (graph.describe with ``before``), on the SDFGs a real session compiled:
a pre-norm residual block through map fusion, tasklet fusion (before autodiff: the backward is made anew),
vectorization and DaCe's auto_optimize."""

from __future__ import annotations

import pytest

import dcnb
from dcnb._src.diff import Diff
from dcnb._src.views import graph, render
from tests.zoo import CASES

pytestmark = pytest.mark.compile

STEPS = ("map_fusion", "tasklet_fusion", "vectorization", "auto_optimize")


@pytest.fixture(scope="module")
def session() -> dcnb.Session:
    module, inputs = CASES["prenorm_residual"].build()
    session = dcnb.optimize(module, *inputs, baselines=(), time_budget=0.0)
    for name in STEPS:
        step = session.apply(name)
        assert step.ok, step.error
    return session


def _step(session: dcnb.Session, name: str) -> int:
    return next(s.index for s in session.history if s.title == name)


def _diff(session: dcnb.Session, name: str, side: int) -> tuple[dict, set[str]]:
    """The picture of step ``name``'s forward (0) or backward (1) marked against the step it was made from, and
    the guids of the nodes of that step's."""
    index = _step(session, name)
    previous = session.previous_step(index)
    assert previous is not None and previous < index
    before = session.compiled_sdfgs(previous)[side]
    after = session.compiled_sdfgs(index)[side]
    return graph.describe(after, before=before), {str(n.guid) for n, _ in before.all_nodes_recursive()}




def _marked(picture: dict, change: str) -> list[dict]:
    return [n for n in graph.all_nodes(picture) if n.get("change") == change]


def test_the_naive_step_was_made_from_nothing(session):
    assert session.previous_step(0) is None


def test_map_fusion_removes_a_map_and_keeps_the_nodes_it_left_alone(session):
    picture, old = _diff(session, "map_fusion", 0)
    assert graph.MAP_ENTRY in {r["kind"] for r in picture["removed"]}
    assert _marked(picture, graph.CHANGED)  # the map that took the other's body in
    assert not [n for n in _marked(picture, graph.ADDED) if n["kind"] != graph.ACCESS]
    unmarked = [n for n in graph.all_nodes(picture) if "change" not in n]
    # the step's deepcopy kept the guids of everything but access nodes, which are matched by their arrays
    assert all(n["guid"] in old for n in unmarked if n["kind"] == graph.LIBRARY)
    parameters = [n for n in unmarked if n["kind"] == graph.ACCESS and n["name"] in ("norm.weight", "fc.weight")]
    assert len(parameters) == 2 and not any(n["guid"] in old for n in parameters)


def test_tasklet_fusion_marks_the_fused_tasklets_in_the_forward_and_the_backward_made_anew(session):
    forward, _ = _diff(session, "tasklet_fusion", 0)
    fused = _marked(forward, graph.ADDED)
    assert [n["kind"] for n in fused] == [graph.TASKLET] and "∘" in fused[0]["name"]
    assert len([r for r in forward["removed"] if r["kind"] == graph.TASKLET]) >= 2

    backward, old = _diff(session, "tasklet_fusion", 1)
    drawn = graph.all_nodes(backward)
    # autodiff ran again: no node of the backward is the old one by guid, yet most are the same by what they are
    # (but the maps the build adds to zero accumulators, the same in every build: passes/lifetimes.py)
    assert not [n for n in drawn if n["guid"] in old and not n["label"].startswith("zero_")]
    assert len([n for n in drawn if "change" not in n]) > 0.8 * len(drawn)
    assert any("∘" in n["name"] and "backward" in n["name"] for n in _marked(backward, graph.ADDED))
    assert any(r["kind"] == graph.TASKLET and "backward" in r["name"] for r in backward["removed"])


def test_vectorization_changes_maps_and_adds_nothing(session):
    for side in (0, 1):
        picture, old = _diff(session, "vectorization", side)
        assert not _marked(picture, graph.ADDED) and picture["removed"] == []
        assert all(n["guid"] in old for n in graph.all_nodes(picture) if n["kind"] != graph.ACCESS)
    assert any(n["kind"] == graph.MAP_ENTRY for n in _marked(_diff(session, "vectorization", 0)[0], graph.CHANGED))


def test_auto_optimize_expands_library_nodes(session):
    picture, old = _diff(session, "auto_optimize", 1)
    removed = {r["kind"] for r in picture["removed"]}
    assert graph.LIBRARY in removed
    assert all(n["guid"] not in old for n in _marked(picture, graph.ADDED))
    assert {n["kind"] for n in _marked(picture, graph.ADDED)} & {graph.NESTED, graph.MAP_ENTRY, graph.TASKLET}


def test_the_picture_of_the_step_before_marks_what_the_step_took_away_or_changed(session):
    index = _step(session, "map_fusion")
    before, after = session.compiled_sdfgs(session.previous_step(index))[0], session.compiled_sdfgs(index)[0]
    diff = graph.describe(after, before=before)
    earlier = graph.describe(before, after=Diff(before, after))
    gone = _marked(earlier, graph.GONE)
    # the removed map's entry, and the map that took its body in (changed in the picture after)
    removed = {(r["kind"], r["name"]) for r in diff["removed"]}
    assert removed <= {(n["kind"], n["name"]) for n in gone}
    assert {n["label"] for n in _marked(diff, graph.CHANGED)} <= {n["label"] for n in gone}
    # the rest is left alone, and a picture marked against the step before has nothing gone
    assert len(gone) < 0.5 * len(graph.all_nodes(earlier))
    assert not _marked(diff, graph.GONE)


def test_the_static_rendering_shows_what_the_current_step_changed(session):
    html = render.to_html(session)
    assert "PreNormResidual (backward)" in html and "_backward_" not in html
    assert html.count("class='dcnb-changes'") == 2 and "removed: " in html
    picture, _ = _diff(session, "auto_optimize", 1)
    assert render.changes_html(picture) in html
