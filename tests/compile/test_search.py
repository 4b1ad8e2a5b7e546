"""Session.search on real builds: a beam search over recipes, every candidate built, checked and timed as a step,
the best replayed as ordinary steps, the table of every candidate, seeded order, the build cache resumed."""

import dataclasses
import json
import math
import pathlib

import pytest
import torch
from torch import nn

import dcnb
from dcnb._src import build, events, forked, search, timing
from dcnb._src.recipe import Entry
from tests.models import Mish

pytestmark = pytest.mark.compile

#: a shape no other test builds Mish for: the builds this file counts are its own
SHAPE = (3, 5, 6, 16)
ACTIONS = ["map_fusion", "tasklet_fusion", "vectorization"]
#: objective memory with a beam of 1: the level's best is the one candidate storing nothing (tasklet_fusion), so
#: which candidates are tried does not depend on timings; the actions whole (places alone have a test of their own)
SEARCH = dict(objective="memory", actions=ACTIONS, beam=1, depth=2, seed=0, places=0)


def _session() -> dcnb.Session:
    torch.manual_seed(0)
    return dcnb.optimize(Mish(), torch.rand(*SHAPE), baselines=("torch",), time_budget=0.05)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A build cache of this module's own, so that the first search compiles what it tries."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DCNB_CACHE", str(tmp_path_factory.mktemp("search-cache")))
        yield


@pytest.fixture(scope="module")
def searched(cache):
    session = _session()
    return session, session.search(60, **SEARCH)


def _state(pid: int) -> str:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _titles(result) -> list[str]:
    return [c.title for c in result.candidates]


def test_the_search_tries_each_matching_action_and_extends_the_best(searched):
    _, result = searched
    # level 1: every action that matches the naive step; level 2: what still matches after tasklet_fusion (the
    # one tasklet left gives map_fusion nothing to fuse)
    assert _titles(result) == [
        "start", "map_fusion", "tasklet_fusion", "vectorization", "tasklet_fusion, vectorization"
    ]
    assert [c.parent for c in result.candidates] == [None, 0, 0, 0, 2]
    assert all(c.ok for c in result.candidates), [c.error for c in result.candidates]
    assert result.stopped == "nothing left to extend" or result.stopped == "depth reached"
    assert result.builds > 0 and result.seconds < 60


def test_with_no_depth_given_the_levels_go_on_while_the_budget_lasts(searched):
    # a depth of 3 reached the end of a search's levels in 2-6 of its 10 minutes, and left the rest unused
    _, two = searched
    result = _session().search(60, **dict(SEARCH, depth=None))
    assert result.depth is None and "depth open" in result.headline
    # it ends when no candidate is left to extend (or the budget is spent), never at a depth
    assert result.stopped in ("nothing left to extend", "budget spent")
    assert _titles(result)[: len(two.candidates)] == _titles(two)


def test_the_best_is_at_least_as_good_as_the_start(searched):
    _, result = searched
    start, best = result.start, result.best
    assert start.intermediate_bytes == 3 * 4 * math.prod(SHAPE)
    assert best.intermediate_bytes == 0 <= start.intermediate_bytes
    assert best.recipe[0].name == "tasklet_fusion"
    ok = [c for c in result.candidates if c.ok and c.same_as is None]
    assert best.score("memory") == min(c.score("memory") for c in ok)


def test_the_best_becomes_ordinary_steps_with_its_recipe(searched):
    session, result = searched
    names = [e.name for e in result.best.recipe]
    assert [s.name for s in session.history] == ["naive", *names]
    assert all(s.ok for s in session.history) and list(result.steps) == session.history[1:]
    assert session.recipe == result.recipe == [{"name": n} for n in names]
    with events.count() as counted:
        again = dcnb.replay(Mish(), torch.rand(*SHAPE), recipe=json.loads(json.dumps(session.recipe)), baselines=())
    assert counted["build"] == 0 and again.current.intermediate_bytes == 0


def test_the_table_holds_every_candidate(searched):
    _, result = searched
    text = result.as_text()
    assert text.splitlines()[0] == result.headline and "best: #" in text
    for c in result.candidates:
        assert c.title in text
        row = c.to_dict()
        assert row["ok"] and row["dcnb_ms"] > 0 and row["torch_ms"] > 0 and row["ratio"] > 0
        assert row["recipe"] == [e.to_json() for e in c.recipe]
    data = json.loads(json.dumps(result.to_dict()))
    assert len(data["candidates"]) == len(result.candidates) and data["best"] == result.best.index


def test_a_second_search_resumes_from_the_cache_in_the_same_order(searched):
    _, first = searched
    session = _session()
    with events.count() as counted:
        second = session.search(60, **SEARCH)
    assert counted["build"] == 0 == second.builds  # every candidate's binaries from the cache
    assert _titles(second) == _titles(first)  # the same seed, the same order


def test_a_candidate_ending_where_another_did_stands_for_it(searched):
    # a beam of 3 keeps every first action: map_fusion then tasklet_fusion ends where tasklet_fusion alone did (the
    # one tasklet left, the fused maps gone), and vectorization then tasklet_fusion where the other order did
    result = _session().search(60, objective="memory", actions=ACTIONS, beam=3, depth=2, seed=0)
    by_title = {c.title: c for c in result.candidates}
    same = by_title["map_fusion, tasklet_fusion"]
    assert same.ok and same.same_as == by_title["tasklet_fusion"].index and same.step is None
    assert by_title["vectorization, tasklet_fusion"].same_as == by_title["tasklet_fusion, vectorization"].index
    assert not {c.parent for c in result.candidates} & {c.index for c in result.candidates if c.same_as is not None}
    assert result.best.same_as is None
    assert f"the SDFGs of #{same.same_as}: not checked or timed again" in result.as_text()


def test_a_spent_budget_returns_the_start(searched):
    session, _ = searched
    before = session.history
    result = session.search(1e-6, **SEARCH)
    assert result.stopped == "budget spent" and _titles(result) == ["start"]
    assert result.best is result.start and result.steps == () and session.history == before
    assert result.start_recipe == result.recipe == session.recipe != []  # from the steps the first search made
    assert "no candidate did better" in result.as_text()


def test_an_action_matching_at_few_places_is_also_tried_at_each_alone(cache):
    # applied everywhere, an action may help at one place and cost at another: where it matches at a few, the
    # search tries it at each alone too, after the level's actions whole
    session = _session()
    labels = list(dict.fromkeys(p.labels for p in session.places("map_fusion")))
    assert len(labels) >= 2, labels
    result = session.search(300, objective="memory", actions=["map_fusion"], beam=1, depth=1, places=len(labels))
    level = result.candidates[1:]
    assert [c.recipe for c in level] == [(Entry("map_fusion"),), *((Entry("map_fusion", where=w),) for w in labels)]
    assert all(c.ok for c in level), [c.error for c in level]
    alone = [c for c in level[1:] if c.same_as is None]
    assert alone and all(c.step.applied < level[0].step.applied for c in alone)
    assert f"places {len(labels)}" in result.headline and "map_fusion (where " in result.as_text()
    # a place's recipe replays to its binaries: the where is kept
    with events.count() as counted:
        again = dcnb.replay(Mish(), torch.rand(*SHAPE), recipe=[e.to_json() for e in alone[0].recipe], baselines=())
    assert counted["build"] == 0 and again.current.applied == alone[0].step.applied
    # beyond ``places`` places, the whole action stands for them
    fewer = _session().search(300, objective="memory", actions=["map_fusion"], beam=1, depth=1, places=len(labels) - 1)
    assert _titles(fewer) == ["start", "map_fusion"]


def test_a_failing_candidate_is_recorded_with_its_reason():
    # tasklet_fusion fuses a GroupNorm's statistics into one map before autodiff, which cannot store them
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.ReLU())
    session = dcnb.optimize(module, torch.randn(2, 3, 8, 8), training=True, baselines=(), time_budget=0.01)
    result = session.search(60, actions=["tasklet_fusion"], depth=1)
    failed = result.candidates[1]
    assert not failed.ok and "DaCe's autodiff cannot store values computed inside a map" in failed.error
    assert result.best is result.start and len(session.history) == 1  # nothing applied, nothing raised
    row = result.table().rows[1]
    assert not row.ok and row.cells[3] == "no" and "DaCe's autodiff cannot store" in row.cells[-1]


@pytest.mark.parametrize(
    "kwargs,cause",
    [
        (dict(budget=0), "budget must be a number of seconds above 0, not 0"),
        (dict(budget=-5), "budget must be a number of seconds above 0"),
        (dict(budget="60"), "budget must be a number of seconds above 0, not '60'"),
        (dict(budget=60, objective="speed"), "objective must be 'time' or 'memory', not 'speed'"),
        (dict(budget=60, actions=["fuse_everything"]), "unknown action 'fuse_everything'; the actions are"),
        (dict(budget=60, actions="map_fusion"), "must be a list of action names"),
        (dict(budget=60, actions=[]), "actions is empty"),
        (dict(budget=60, actions=[{"nme": "map_fusion"}]), "recipe entry 0 is not a step"),
        (dict(budget=60, actions=[{"name": "map_fusion", "options": {"tile": 16}}]), "map_fusion takes the options"),
        (
            dict(budget=60, actions=["map_fusion", {"name": "simplify_algebra", "options": {"form": "log"}}]),
            "simplify_algebra's form",
        ),
        (dict(budget=60, recipes={"name": "map_fusion"}), "recipes must be a list of recipes (each a list of steps)"),
        (dict(budget=60, recipes=["map_fusion"]), "recipe 0 is not a list of steps"),
        (dict(budget=60, recipes=[[], ["fuse_everything"]]), "recipe 1: unknown action 'fuse_everything'"),
        (dict(budget=60, recipes=[[{"name": "map_fusion", "options": {"tile": 16}}]]), "map_fusion takes the options"),
        (dict(budget=60, beam=0), "beam must be a whole number, 1 or more, not 0"),
        (dict(budget=60, depth=1.5), "depth must be a whole number, 1 or more, not 1.5"),
        (dict(budget=60, places=-1), "places must be a whole number, 0 or more, not -1"),
    ],
)
def test_bad_input_names_its_cause(searched, kwargs, cause):
    session, _ = searched
    before = session.history
    with pytest.raises(dcnb.DcnbError, match="search's|recipe entry") as raised:
        session.search(**kwargs)
    assert cause in str(raised.value) and session.history == before


def test_compiles_here_run_while_a_candidate_is_checked_and_pause_while_it_is_timed(tmp_path, monkeypatch):
    monkeypatch.setenv("DCNB_CACHE", str(tmp_path / "cache"))
    runners = []  # where the search's compiles run
    compiling, timed = build.compiling, timing.Baselines.time
    seen = []  # for each timing: the states of the search's compiles not ended, and of every process below them

    def recorded_compiling(at_once=None):
        runners.append(compiling(at_once))
        return runners[-1]

    def recorded(self, candidate):
        running = [c.pid for r in runners for c in r._children.values() if not c.done()]
        seen.append([_state(p) for pid in running for p in [pid, *forked._descendants(pid)]])
        return timed(self, candidate)

    torch.manual_seed(0)  # a shape of its own: no binary of it is loaded in this process
    session = dcnb.optimize(Mish(), torch.rand(2, 9, 4, 16), baselines=("torch",), time_budget=0.05)
    monkeypatch.setattr(build, "compiling", recorded_compiling)
    monkeypatch.setattr(timing.Baselines, "time", recorded)
    result = session.search(300, **SEARCH)
    assert result.builds > 0 and all(c.ok for c in result.candidates)
    during = seen[: len(result.candidates) - 1]  # the candidates' timings (then the best's steps are applied)
    assert any(during), "no candidate's compile ran beside another's check: the search built one at a time"
    # stopped, ended, or inside the kernel (D: writing the build to disk) with the stop taking effect as it leaves:
    # on no core either way
    assert all(state in "TtZD" for states in during for state in states), during


def test_the_best_on_time_is_the_fastest_of_the_finalists_timed_together(cache):
    # each candidate's ratio comes from a timing run of its own, minutes apart at full size on a machine whose load
    # moves: the best few and the start are timed again in one interleaved run, and the fastest there wins
    result = _session().search(60, objective="time", actions=ACTIONS, beam=1, depth=1, seed=0)
    together = {c.index: c.together for c in result.candidates if c.together is not None}
    assert 0 in together and 2 <= len(together) <= search.FINALISTS + 1, together
    assert all(r > 0 for r in together.values())
    assert result.best.together == min(together.values())
    assert result.to_dict()["candidates"][result.best.index]["together"] == result.best.together
    if result.best.index != 0:
        assert "timed together" in result.summary()


def test_finalists_the_closing_run_cannot_tell_from_the_fastest_are_timed_again(cache):
    # one run put MobileNetV2's start 0.5% ahead of auto_optimize (all flagged noisy), the run after it 6% behind:
    # those whose times overlap the fastest's are timed together again; here one binary under two names
    torch.manual_seed(0)
    session = dcnb.optimize(Mish(), torch.rand(*SHAPE), baselines=("torch",), time_budget=0.5)
    start = search.Candidate(index=0, recipe=(), parent=None, ok=True, step=session.current)
    twin = dataclasses.replace(start, index=1)
    state = session._states[-1]
    with events.count() as counted:
        ratios = search._together(session, [(start, state), (twin, state)])
    assert 2 <= counted["timed together"] <= 1 + search.RETIMED
    assert set(ratios) == {0, 1} and all(r > 0 and c is None for r, c in ratios.values())


def _twins(session, count: int) -> list:
    """``count`` candidates of the session's current binary under as many names: their own timings the same."""
    start = search.Candidate(index=0, recipe=(), parent=None, ok=True, step=session.current)
    state = session._states[-1]
    return [(dataclasses.replace(start, index=i + 1, recipe=(Entry(f"twin{i}"),)), state) for i in range(count)]


def _slower(pair, times: float, noise: bool = False):
    """The candidate of ``pair`` as if its own run had timed it ``times`` as slow, its runs' middle half as tight."""
    candidate, state = pair
    step = candidate.step
    own = step.timings["dcnb"]
    slow = dataclasses.replace(own, median=own.median * times, q1=own.q1 * times, q3=own.q3 * times)
    notes = (f"{timing.NOISE_NOTE}: its runs spread",) if noise else ()
    made = dataclasses.replace(step, timings={**step.timings, "dcnb": slow}, notes=notes)
    return dataclasses.replace(candidate, step=made), state


def test_a_level_whose_candidates_past_the_beam_its_own_timings_cannot_tell_apart_is_ranked_by_one_run(cache):
    # ConvNeXt-T's channels_last, on the cores where it led the best recipe known, fell outside a beam of 3 by its
    # own run, minutes from the others', and was never extended: the beam and those past it that their own timings
    # cannot tell from its last are timed in one interleaved run, which orders them; here one binary under 5 names
    torch.manual_seed(0)
    session = dcnb.optimize(Mish(), torch.rand(*SHAPE), baselines=("torch",), time_budget=0.2)
    children = _twins(session, 5)
    ranked, tiebreak = {}, {c.index: 0.5 for c, _ in children}
    with events.count() as counted:
        chosen = search._beam_chosen(session, children, 2, "time", 0.2, ranked, tiebreak)
    assert counted["timed together"] == 1
    # the beam of 2 and 2 contenders in the run (the fifth past the cap), ordered by it, ahead of the rest
    assert set(ranked) == {1, 2, 3, 4} and all(r > 0 for r in ranked.values())
    assert [c.index for c, _ in chosen[:4]] == sorted(ranked, key=ranked.get) and chosen[4][0].index == 5
    # one far behind the beam's last by its own run is not timed again, unless that run was noise
    far = [*children[:2], _slower(children[2], 3.0)]
    with events.count() as counted:
        assert search._beam_chosen(session, far, 2, "time", 0.2, {}, tiebreak) == far
        assert search._beam_chosen(session, far, 2, "memory", 0.2, {}, tiebreak) == far
    assert counted["timed together"] == 0
    noisy = [*children[:2], _slower(children[2], 3.0, noise=True)]
    again: dict[int, float] = {}
    with events.count() as counted:
        search._beam_chosen(session, noisy, 2, "time", 0.2, again, tiebreak)
    assert counted["timed together"] == 1 and set(again) == {1, 2, 3}


def test_a_search_extends_the_beam_its_level_run_chose(cache):
    result = _session().search(120, objective="time", actions=ACTIONS, beam=1, depth=2, seed=0, places=0)
    first = [c for c in result.candidates if c.parent == 0 and c.ok and c.same_as is None]
    extended = {c.parent for c in result.candidates if c.parent not in (None, 0)}
    ranked = {c.index: c.ranked for c in first if c.ranked is not None}
    # (a level-2 candidate extends the one candidate of the beam, where an action matches after it)
    if ranked:  # the level's candidates past its beam of 1 were tied with it by their own runs
        assert extended <= {min(ranked, key=ranked.get)}
        assert result.to_dict()["candidates"][first[0].index]["ranked"] == first[0].ranked
    else:
        assert extended <= {min(first, key=lambda c: c.ratio).index}


def test_the_closing_run_takes_its_share_of_the_search_budget(cache, monkeypatch):
    # a step's timing budget gave full-size blocks (0.4 s a call) 3 rounds in the run that picks the best
    budgets = []
    real = timing.interleaved

    def recorded(fns, **kwargs):
        budgets.append((set(fns), kwargs["budget_s"]))
        return real(fns, **kwargs)

    monkeypatch.setattr(timing, "interleaved", recorded)
    result = _session().search(100, objective="time", actions=ACTIONS, beam=1, depth=1, places=0)
    closing = [budget for names, budget in budgets if "0" in names]  # the start, by its index
    assert closing and result.start.together is not None
    assert all(budget == search.CLOSING * 100 > 0.05 for budget in closing), closing
    steps = [budget for names, budget in budgets if "dcnb" in names]
    assert steps and all(budget == 0.05 for budget in steps)  # each candidate's own timing keeps the session's


@pytest.mark.deep
def test_what_the_best_is_to_beat_is_timed_with_the_finalists_whatever_its_own_timing(cache, monkeypatch):
    # a search of ResNet left auto_optimize out of its closing run (its own timing, minutes before, put it behind
    # three others) and ended 3% slower than it in the run after: the start, auto_optimize and the recipes given
    # are in that run whatever their rank (no finalist by rank here, to tell them apart)
    monkeypatch.setattr(search, "FINALISTS", 0)
    session = dcnb.optimize(Mish(), torch.rand(*SHAPE), time_budget=0.05)  # torch.compile a baseline too
    kept = [{"name": "tasklet_fusion"}, {"name": "vectorization"}]
    result = session.search(
        300, objective="time", actions=["map_fusion", "auto_optimize"], beam=1, depth=1, recipes=[kept]
    )
    titles = _titles(result)
    # the recipe first, each of its steps a candidate, then the level's candidates, auto_optimize the first of them
    # (a search whose budget ran out before it reached auto_optimize ended 5% behind it)
    kept_titles = ["tasklet_fusion", "tasklet_fusion, vectorization"]
    assert titles[:5] == ["start", *kept_titles, "auto_optimize", "map_fusion"], titles
    assert [c.parent for c in result.candidates[:3]] == [None, 0, 1] and result.known == (2,)
    auto = result.candidates[titles.index("auto_optimize")]
    assert auto.ok
    rivals = {0, 2, auto.index if auto.same_as is None else auto.same_as}
    timed = {c.index for c in result.candidates if c.together is not None}
    assert timed == rivals, (timed, titles)
    assert all(result.candidates[i].together_compile > 0 for i in timed)  # torch.compile was in the run
    assert result.best.index in rivals and result.best.together == min(result.candidates[i].together for i in timed)
    assert result.to_dict()["known"] == [2]


def test_a_first_level_tries_the_layout_of_the_kernels_right_after_the_reference(cache):
    # in the registry's order channels_last came ninth and tenth of ResNet-50's and MobileNetV2's first levels at
    # full size, past what a budget reaches at a minute a candidate
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))
    session = dcnb.optimize(module, torch.randn(1, 3, 16, 16), baselines=(), time_budget=0.01)
    wanted = ["vectorization", "channels_last", "auto_optimize"]
    result = session.search(300, objective="memory", actions=wanted, beam=1, depth=1, places=0)
    assert [c.title for c in result.candidates] == ["start", "auto_optimize", "channels_last", "vectorization"]


def test_a_recipe_given_is_built_from_the_start_and_extended_as_a_first_action_is(cache):
    session = _session()
    assert session.apply("map_fusion").ok
    # a whole recipe (the start's own step at its head, as a kept recipe is) goes on from the start
    whole = [*session.recipe, {"name": "tasklet_fusion"}]
    result = session.search(300, objective="memory", actions=["vectorization"], beam=3, depth=2, recipes=[whole])
    first = result.candidates[1]
    assert first.title == "tasklet_fusion" and first.parent == 0 and first.ok and result.known == (1,)
    assert result.recipe[:1] == [{"name": "map_fusion"}]
    # the recipe's end competes with the first level to be extended; the second level extends it
    extended = [c for c in result.candidates if c.parent == 1]
    assert [c.title for c in extended] == ["tasklet_fusion, vectorization"], _titles(result)
