"""The allclose rule on nan and inf: the same special value matches, any other pairing fails."""

import math

import torch

from dcnb._src import verify


def _check(got, want):
    return verify.compare(verify.Run({"output": torch.tensor(got)}), verify.Run({"output": torch.tensor(want)}))


def test_equal_infinities_and_nans_match():
    result = _check([math.inf, -math.inf, math.nan, 2.0], [math.inf, -math.inf, math.nan, 2.0])
    assert result.ok and result.max_abs_error == 0.0


def test_a_special_value_against_anything_else_fails():
    for got, want in (([math.inf], [-math.inf]), ([math.nan], [1.0]), ([1.0], [math.inf]), ([math.inf], [math.nan])):
        result = _check(got, want)
        assert not result.ok and result.errors["output"] == math.inf, (got, want)


def test_an_infinity_elsewhere_does_not_loosen_the_tolerance():
    # the tolerance scales with the largest finite magnitude, not with an inf in the reference
    assert not _check([math.inf, 1.5], [math.inf, 1.0]).ok
