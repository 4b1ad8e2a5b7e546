"""A step slower than the one it was made from says so in its notes, with what it changed."""

from dcnb._src.record import Step, slower_note
from dcnb._src.timing import Timing


def _step(index, name, dcnb_ms, torch_ms, kernels):
    timings = {"dcnb": Timing.of([dcnb_ms]), "torch": Timing.of([torch_ms])}
    counts = {"forward": {"kernels": kernels, "library_nodes": 4, "maps": kernels}}
    return Step(index, name, {}, None, ok=True, timings=timings, counts=counts)


def test_a_slower_step_says_by_how_much_and_what_it_changed():
    naive = _step(0, "naive", 10.0, 10.0, kernels=12)
    note = slower_note(naive, _step(1, "auto_optimize", 30.0, 10.0, kernels=5))
    assert note is not None and note.startswith("slower than step 0 (naive)")
    assert "3.00x eager's time against 1.00x" in note and "forward -7 kernels" in note


def test_times_compare_as_ratios_to_eager_measured_in_each_run():
    # the machine got twice as slow between the two runs: eager too, so the step is not slower
    assert slower_note(_step(0, "naive", 10.0, 10.0, 12), _step(1, "map_fusion", 20.0, 20.0, 6)) is None
    assert slower_note(_step(0, "naive", 10.0, 10.0, 12), _step(1, "map_fusion", 10.5, 10.0, 6)) is None
