"""A step's analysis: named results worked out once, which the views fill and the session keeps (no compiles)."""

from dcnb._src import events
from dcnb._src.analysis import Analysis


def test_each_result_is_worked_out_once_and_listed_in_the_order_it_was():
    analysis = Analysis(3)
    assert repr(analysis) == "Analysis(step 3: nothing worked out yet)" and analysis.known("overlays") is None
    made = []
    with events.count() as counted:
        first = analysis.result("overlays", lambda: made.append(1) or {"forward": {}})
        assert analysis.result("overlays", lambda: made.append(2)) is first
    assert made == [1] and counted["analysis overlays"] == 1
    analysis.store("profile", {"step_ms": 1.0})
    analysis.store("profile", {"step_ms": 2.0})  # profiled again: the newer one is kept
    assert analysis.known("profile") == {"step_ms": 2.0} and "profile" in analysis
    assert analysis.names == ("overlays", "profile")
    assert repr(analysis) == "Analysis(step 3: overlays, profile)"
    assert analysis.take("overlays") is first and analysis.take("overlays") is None
    assert analysis.names == ("profile",)
