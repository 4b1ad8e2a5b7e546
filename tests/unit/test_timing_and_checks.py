"""Pure-Python pieces: timing statistics, the allclose rule, tables, cache keys."""

import collections
import itertools
import math

import torch

from dcnb._src import cache, record, timing, verify


def test_interleaved_timing_fits_the_budget_and_balances_who_runs_after_whom():
    order = []
    fns = {name: (lambda n=name: order.append(n)) for name in ("a", "b", "c")}
    result = timing.interleaved(fns, budget_s=0.0, warmup=1, min_runs=6)
    assert set(result) == {"a", "b", "c"} and all(t.runs == 6 for t in result.values())
    measured = order[3:]  # after one warm-up round; the first timed round sizes the run
    assert len(measured) == 18 and measured[:3] == ["a", "b", "c"]
    rounds = [measured[i : i + 3] for i in range(0, 18, 3)]
    # a plain rotation (abc, bca, cab) would always time b right after a: a slow one leaves the caches cold
    follows = collections.Counter((r[i], r[i + 1]) for r in rounds for i in range(2))
    assert set(follows) == set(itertools.permutations("abc", 2)) and set(follows.values()) == {2}
    assert all(collections.Counter(r[i] for r in rounds) == dict.fromkeys("abc", 2) for i in range(3))
    for n in range(1, 8):
        orders = timing._orders(n)
        pairs = collections.Counter((o[i], o[i + 1]) for o in orders for i in range(n - 1))
        assert all(sorted(o) == list(range(n)) for o in orders)
        assert len(pairs) == n * (n - 1) and len(set(pairs.values())) <= 1
    t = result["a"]
    assert t.min <= t.median <= t.max and t.stdev >= 0


def test_interleaved_timing_warms_up_only_what_needs_it():
    calls = {"new": 0, "warm": 0}
    fns = {name: (lambda n=name: calls.__setitem__(n, calls[n] + 1)) for name in calls}
    result = timing.interleaved(fns, budget_s=0.0, warmup={"new": 2}, min_runs=3)
    assert calls == {"new": 5, "warm": 3} and result["warm"].runs == 3


def test_interleaved_timing_waits_for_each_call_where_told():
    # CUDA kernels run after their launch returns: a call's time must end when its work has
    events = []
    fns = {name: (lambda n=name: events.append(n)) for name in ("a", "b")}
    timing.interleaved(fns, budget_s=0.0, warmup=1, min_runs=2, sync=lambda: events.append("sync"))
    assert events == ["a", "b", "sync", "a", "sync", "b", "sync", "b", "sync", "a", "sync"]


def test_timing_statistics():
    t = timing.Timing.of([1.0, 2.0, 3.0, 10.0])
    assert (t.min, t.median, t.max, t.runs) == (1.0, 2.5, 10.0, 4)
    assert math.isclose(t.mean, 4.0)


def test_quartiles_say_how_far_apart_the_middle_half_of_the_runs_lies():
    t = timing.Timing.of([1.0, 2.0, 3.0, 10.0])
    assert (t.q1, t.q3) == (1.75, 4.75) and math.isclose(t.spread, 3.0 / 2.5)
    assert timing.Timing.of([2.0]).spread == 0.0
    # timings made without quartiles (older records) say nothing about their spread
    assert timing.Timing(1.0, 1.0, 1.0, 0.0, 1.0, 1).spread is None


def _runs(median: float, spread: float, n: int = 20) -> timing.Timing:
    """Synthetic rounds: ``n`` runs spaced evenly so that their middle half spans ``spread`` of ``median``."""
    step = median * spread / ((n - 1) / 2)  # the quartiles lie (n - 1) / 2 runs apart
    return timing.Timing.of([median + (i - (n - 1) / 2) * step for i in range(n)])


def test_runs_that_vary_widely_make_the_ratio_noise():
    steady = {"dcnb": _runs(1.0, 0.05), "torch": _runs(1.2, 0.05)}
    assert timing.noise(steady, load=0.5, cores=2) == ()
    # dcnb's own runs, which every ratio and every comparison between steps reads
    (note,) = timing.noise({**steady, "dcnb": _runs(1.0, 0.4)}, load=0.5, cores=2)
    assert note.startswith(timing.NOISE_NOTE) and "dcnb 40%" in note and "torch" not in note
    # a baseline's runs, where they reach dcnb's: which is faster is within their variation
    (note,) = timing.noise({**steady, "torch": _runs(1.1, 0.5)}, load=0.5, cores=2)
    assert "torch 50%" in note and "dcnb" not in note.split("(")[1]
    # ... not where the baseline is far from dcnb however its runs vary (torch eager 15x faster, 34% spread)
    assert timing.noise({"dcnb": _runs(10.0, 0.03), "torch": _runs(0.7, 0.34)}, load=0.5, cores=2) == ()
    # a few runs far off (a page fault, a timer tick: here one in eight) leave the middle half as it was
    spikes = timing.Timing.of([1.0, 1.01, 1.02, 1.0, 1.01, 1.02, 1.01, 5.0] * 3)
    assert timing.noise({"dcnb": spikes, "torch": _runs(1.5, 0.05)}) == ()


def test_a_busy_machine_makes_the_ratio_noise():
    steady = {"dcnb": _runs(1.0, 0.05), "torch": _runs(1.2, 0.05)}
    (note,) = timing.noise(steady, load=3.4, cores=2)
    assert note == (
        "timing is noise: the machine was busy while timing (load average 3.4 on 2 cores); the ratios may be off: "
        "apply the step again when it is idle"
    )
    assert timing.noise(steady, load=2.0, cores=2) == () and timing.noise(steady, load=None, cores=2) == ()
    assert len(timing.noise({"dcnb": _runs(1.0, 0.4)}, load=9.0, cores=2)) == 2


def test_a_noisy_step_says_so_beside_its_ratio():
    timings = {"dcnb": _runs(1.0, 0.4), "torch": _runs(2.0, 0.05)}
    notes = timing.noise(timings)
    noisy = record.Step(1, "map_fusion", {}, None, ok=True, timings=timings, notes=notes)
    steady = record.Step(0, "naive", {}, None, ok=True, timings={"dcnb": _runs(1.0, 0.05), "torch": _runs(2.0, 0.05)})
    assert f"note: {notes[0]}" in noisy.as_text()
    naive, fused = record.history_table([steady, noisy])[2:]
    assert naive.rstrip(" |").endswith("2.00x") and fused.rstrip(" |").endswith("2.00x (noise)")


def test_compare_scales_tolerance_by_magnitude_and_names_the_worst():
    want = verify.Run({"output": torch.tensor([1000.0, 1.0]), "grad x": torch.tensor([1.0, 2.0])})
    close = verify.Run({"output": torch.tensor([1000.05, 1.0]), "grad x": torch.tensor([1.0, 2.0])})
    assert verify.compare(close, want).ok
    far = verify.Run({"output": torch.tensor([1000.0, 1.0]), "grad x": torch.tensor([1.0, 2.01])})
    check = verify.compare(far, want)
    assert not check.ok and check.worst == "grad x"
    assert check.message.startswith("grad x differs from PyTorch (max abs error 0.01")
    missing = verify.compare(verify.Run({"output": want.tensors["output"]}), want)
    assert not missing.ok and missing.worst == "grad x"
    # a gradient PyTorch computes as zeros may be missing: the graph dcnb compiled does not read that tensor
    zeros = verify.Run({**want.tensors, "grad y": torch.zeros(3)})
    assert verify.compare(verify.Run(want.tensors), zeros).ok
    assert not verify.compare(verify.Run(want.tensors), verify.Run({**zeros.tensors, "grad y": torch.ones(3)})).ok
    assert not verify.compare(verify.Run({"grad x": want.tensors["grad x"]}), verify.Run({"output": torch.zeros(2)})).ok


def test_compare_lets_dcnb_be_as_far_from_float64_as_twice_pytorchs_float32():
    exact = verify.Run({"grad w": torch.tensor([0.034, -0.01], dtype=torch.float64)})
    want = verify.Run({"grad w": torch.tensor([0.054, -0.01])})  # PyTorch's float32: 0.02 off
    near, far = verify.Run({"grad w": torch.tensor([0.004, -0.01])}), verify.Run({"grad w": torch.tensor([0.084, -0.01])})
    assert not verify.compare(near, want).ok and verify.compare(near, want, exact=exact).ok
    assert not verify.compare(far, want, exact=exact).ok


def test_a_gradient_zero_but_for_rounding_may_be_as_far_from_float64_as_four_times_pytorchs_float32():
    # a bias before a training BatchNorm (LeViT's): zero in float64, rounding noise in any float32 summation order
    exact = verify.Run({"grad b": torch.tensor([1e-13, -1e-13], dtype=torch.float64)})
    want = verify.Run({"grad b": torch.tensor([4.6e-5, -2e-5])})
    near, far = verify.Run({"grad b": torch.tensor([-1.2e-4, 0.0])}), verify.Run({"grad b": torch.tensor([-2e-4, 0.0])})
    assert not verify.compare(near, want).ok and verify.compare(near, want, exact=exact).ok
    assert not verify.compare(far, want, exact=exact).ok


def test_a_gradient_past_relu_kinks_may_be_as_far_from_float64_as_twice_pytorchs_float32_in_root_mean_square():
    # a deep network: pre-activations within float32's error of a kink take one side in one summation order and
    # the other in another; PyTorch's float32 and dcnb differ from float64 in a few elements each, not the same ones
    exact = torch.linspace(-1, 1, 1000, dtype=torch.float64)
    want = exact.float().clone()
    want[[10, 200, 300, 700]] += 0.1
    flipped = exact.float().clone()
    flipped[500] -= 0.25  # 2.5x PyTorch's farthest, 1.25x its root mean square
    wrong = exact.float().clone()
    wrong[::50] -= 0.25  # 20 elements: 5.6x its root mean square
    exact, want = verify.Run({"grad w": exact}), verify.Run({"grad w": want})
    assert verify.compare(verify.Run({"grad w": flipped}), want, exact=exact).ok
    assert not verify.compare(verify.Run({"grad w": wrong}), want, exact=exact).ok


def test_a_small_gradient_with_one_kink_flipped_matches_where_all_its_other_elements_are_as_near_as_pytorchs():
    # a training MobileNetV2 at batch 8: one of 960 channels of a BatchNorm bias's gradient moved by 0.058 (a
    # pre-activation 1.8e-6 from ReLU6's kink), where PyTorch's float32 is at most 0.006 from float64: 9.5x as far at
    # its farthest element, 2.8x in root mean square
    exact = torch.linspace(-0.8, 0.8, 960, dtype=torch.float64)
    want = exact.float().clone()
    want[::40] += 0.006
    flipped = exact.float().clone()
    flipped[[31, 500]] += torch.tensor([0.058, 0.005])
    twice = flipped.clone()
    twice[700] += 0.058  # a second channel as far: more than one in a thousand
    exact, want = verify.Run({"grad b": exact}), verify.Run({"grad b": want})
    assert not verify.compare(verify.Run({"grad b": flipped}), want).ok
    assert verify.compare(verify.Run({"grad b": flipped}), want, exact=exact).ok
    assert not verify.compare(verify.Run({"grad b": twice}), want, exact=exact).ok
    few = verify.Run({"grad b": torch.tensor([0.058, 0.1], dtype=torch.float64)})  # too few elements to tell
    pytorchs = verify.Run({"grad b": torch.tensor([0.0575, 0.1])})
    assert not verify.compare(verify.Run({"grad b": torch.tensor([0.0, 0.1])}), pytorchs, exact=few).ok


def test_a_gradient_may_be_as_far_from_float64_as_twice_pytorchs_float32_in_another_order_of_summation():
    # a full-size ResNet-50 in eval mode at batch 4: a BatchNorm bias's gradient of 64 channels, PyTorch's default
    # order 0.013 from float64 at its farthest, its one-thread order without oneDNN 0.12, dcnb's after auto_optimize
    # 0.122 (a kink flipped where neither of PyTorch's orders flipped it)
    exact = torch.linspace(-20, 20, 64, dtype=torch.float64)
    want = exact.float().clone()
    want[[3, 40]] += 0.013
    other = exact.float().clone()
    other[[9, 17, 50]] -= 0.12
    ours = exact.float().clone()
    ours[[5, 30]] += 0.122
    exact, want, other = (verify.Run({"grad b": t}) for t in (exact, want, other))
    assert not verify.compare(verify.Run({"grad b": ours}), want, exact=exact).ok
    assert verify.compare(verify.Run({"grad b": ours}), want, exact=exact, others=(other,)).ok
    wrong = ours.clone()
    wrong[[5, 30]] += 0.5  # five times as far as either of PyTorch's orders, in every measure
    assert not verify.compare(verify.Run({"grad b": wrong}), want, exact=exact, others=(other,)).ok


def test_runs_are_the_same_only_bit_for_bit():
    run = verify.Run({"output": torch.tensor([1.0, 2.0]), "grad x": torch.tensor([3.0])})
    assert run.same_as(verify.Run({k: t.clone() for k, t in run.tensors.items()}))
    nudged = torch.nextafter(torch.tensor([2.0]), torch.tensor([3.0]))
    assert not run.same_as(verify.Run({**run.tensors, "output": torch.cat([torch.tensor([1.0]), nudged])}))
    assert not run.same_as(verify.Run({"output": run.tensors["output"]}))
    # nan is not equal to itself: such runs get the full comparison
    assert not verify.Run({"output": torch.tensor([float("nan")])}).same_as(verify.Run({"output": torch.tensor([float("nan")])}))


def test_compare_accepts_nans_in_the_same_places_only():
    want = verify.Run({"output": torch.tensor([float("nan"), 1.0])})
    assert verify.compare(verify.Run({"output": torch.tensor([float("nan"), 1.0])}), want).ok
    assert not verify.compare(verify.Run({"output": torch.tensor([0.0, float("nan")])}), want).ok


def test_history_table_lists_failed_steps_with_their_reason():
    ok = record.Step(0, "naive", {}, None, ok=True, intermediate_bytes=3 << 20, compile_seconds=1.5,
                     timings={"dcnb": timing.Timing.of([2.0]), "torch": timing.Timing.of([4.0])})
    failed = record.Step(1, "vectorization", {}, None, ok=False, error="the generated code does not compile: x")
    lines = record.history_table([ok, failed])
    assert "3.00" in lines[2] and "2.00x" in lines[2]
    assert "no" in lines[3] and "does not compile" in lines[3]
    assert ok.speedup() == 2.0


def test_cache_key_depends_on_content_device_and_flags():
    import dace

    sdfg = dace.SDFG("a")
    sdfg.add_array("A", [4], dace.float32)
    base = cache.key(sdfg, "cpu", {"cpu.args": "-O3"})
    assert base == cache.key(sdfg, "cpu", {"cpu.args": "-O3"})
    assert base != cache.key(sdfg, "cuda", {"cpu.args": "-O3"})
    assert base != cache.key(sdfg, "cpu", {"cpu.args": "-O2"})
    sdfg.add_array("B", [4], dace.float32)
    assert base != cache.key(sdfg, "cpu", {"cpu.args": "-O3"})


def test_cache_key_depends_on_the_dace_internals_dcnb_replaces(monkeypatch):
    # they decide generated code after the SDFG is hashed (a CUDA build's streams and host waits): a change to them
    # reused binaries built without it
    import pathlib

    import dace

    from dcnb._src import dace_internals

    sdfg = dace.SDFG("a")
    sdfg.add_array("A", [4], dace.float32)
    cache._fixes_digest.cache_clear()
    base = cache.key(sdfg, "cuda", {})
    replaced = pathlib.Path(dace_internals.__file__)
    read = pathlib.Path.read_bytes
    monkeypatch.setattr(pathlib.Path, "read_bytes", lambda p: read(p) + b"#" if p == replaced else read(p))
    cache._fixes_digest.cache_clear()
    try:
        assert cache.key(sdfg, "cuda", {}) != base
    finally:
        monkeypatch.undo()
        cache._fixes_digest.cache_clear()
