"""What the views work out of a step (its overlays, its code, its profile) is kept in the step's analysis, reachable
from the session (``Session.analysis``) and worked out once, on real builds of Mish."""

import pytest
import torch
from tests.models import Mish

import dcnb
from dcnb._src import events
from dcnb._src.views import overlays, profile, sources

pytestmark = pytest.mark.compile


def test_a_step_s_overlays_code_and_profile_are_kept_in_its_analysis_and_worked_out_once():
    session = dcnb.optimize(Mish(), torch.rand(2, 3, 8, 8), baselines=(), time_budget=0.0)
    naive = session.analysis()
    assert naive.names == () and overlays.known(session) is None and profile.measured(session) is None
    assert repr(naive) == "Analysis(step 0: nothing worked out yet)"

    with events.count() as counted:
        found = overlays.of(session)
        assert overlays.of(session, 0) is found and overlays.known(session) is found
        # the copies the overlays counted the library nodes' work in are kept until the code is read from them
        assert set(naive.names) == {"generated copy forward", "generated copy backward", "overlays"}
        code = sources.of(session)
        assert sources.of(session) is code
    assert counted["analysis overlays"] == counted["analysis sources"] == 1
    assert session.analysis(0) is naive and naive.known("overlays") is found and naive.known("sources") is code
    assert repr(naive) == "Analysis(step 0: overlays, sources)"

    assert session.apply("tasklet_fusion").ok
    fused = session.analysis()
    assert fused is not naive and fused.names == () and overlays.known(session, 0) is found
    measured = profile.run(session, runs=1)
    assert fused.names == ("profile",) and profile.measured(session) is measured
    assert profile.table(session)["step_ms"] == measured["step_ms"] and profile.table(session, 0) is None
    assert all("ms" in overlays.measured(session)["forward"][k["guid"]] for k in measured["kernels"]
               if k["side"] == "forward")

    # an undone step's analysis goes with it: the step applied again (at the same index) starts with none
    session.undo()
    with pytest.raises(dcnb.DcnbError, match="not a good step"):
        session.analysis(1)
    assert session.apply("tasklet_fusion").ok
    assert session.analysis(1).names == () and profile.measured(session) is None


def test_the_actions_on_offer_are_worked_out_once_a_state_and_selection():
    # the view asks after every request: a cancelled step's refresh spent 450 ms of its 2 s working them out again
    session = dcnb.optimize(Mish(), torch.rand(2, 3, 8, 8), baselines=(), time_budget=0.0)

    def worked_out(counted) -> int:
        return sum(n for name, n in counted.items() if name.startswith("analysis offers"))

    with events.count() as counted:
        offered = session.actions()
        assert session.actions() == offered and session.actions() is not session.actions()
        assert session.places("tasklet_fusion") == list(next(a for a in offered if a.name == "tasklet_fusion").at)
    assert worked_out(counted) == 1
    place = session.places("tasklet_fusion")[0]
    with events.count() as counted:
        assert session.actions(where=place.labels) != offered
    assert worked_out(counted) == 1

    assert session.apply("tasklet_fusion").ok
    with events.count() as counted:
        fused = session.actions()
    assert worked_out(counted) == 1 and fused != offered
    session.undo()
    with events.count() as counted:
        assert session.actions() == offered
    assert worked_out(counted) == 0
