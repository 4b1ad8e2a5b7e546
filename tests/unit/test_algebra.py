"""simplify_algebra's rewriting and its accuracy guard, on the code DaCe's tasklets hold (no compiles)."""

import pytest

from dcnb._src.actions import algebra

# Mish as tasklet_fusion leaves it, forward and backward (DaCe's autodiff wrote the backward)
MISH = "__out = (__in1 * tanh(log((dace.float32(1) + exp(__in1)))))"
MISH_BACKWARD = (
    "x0 = exp(__in1)\nx1 = (x0 + 1)\nx2 = tanh(log(x1))\n"
    "__in1_gradient = (__out_gradient * ((((x0 * __in1) * (dace.float32(1) - (x2 ** 2))) / x1) + x2))"
)
X, GRAD = ("__in1",), ("__in1", "__out_gradient")


def _analyze(code, inputs=X, outputs=("__out",), form="auto"):
    return algebra.analyze(code, inputs, outputs, "float32", form)


def test_mish_and_its_derivative_need_one_exp():
    forward = _analyze(MISH)
    backward = _analyze(MISH_BACKWARD, GRAD, ("__in1_gradient",))
    for found in (forward, backward):
        assert found.calls == 3 and found.rewrite is not None and found.rewrite.calls == 1
        assert found.rewrite.form == "split"
        assert algebra.calls(found.rewrite.code) == 1 and "exp(" in found.rewrite.code
        # the plain one-exp form overflows (e^2 is inf for x > 44) and the guard said so
        [(form, reason)] = found.rejected
        assert form == "exp" and "nan" in reason


def test_the_guard_rejects_the_naive_derivative_of_the_issue_form():
    # d/dx of x * (1 - 2 / (1 + (1 + e^x)^2)), differentiated as written: inf / inf for large x
    naive = (
        "e = exp(__in1)\nu = (1 + e)\n"
        "__in1_gradient = (__out_gradient * ((1 - (2 / (1 + u ** 2))) + (((4 * __in1) * u) * e) / ((1 + u ** 2) ** 2)))"
    )
    reason = algebra.guard(MISH_BACKWARD, naive, GRAD, ("__in1_gradient",), "float32")
    assert reason is not None and "nan" in reason and "__in1=" in reason


def test_the_guard_rejects_a_rewrite_that_cancels_at_tiny_inputs():
    # tanh(x) = 1 - 2 / (e^2x + 1) is exact in reals, but in float32 gives 0 for |x| < 3e-8
    reason = algebra.guard("__out = tanh(__in1)", "__out = (1 - (2 / (exp(2 * __in1) + 1)))", X, ("__out",), "float32")
    assert reason is not None and reason.startswith("loses accuracy")


def test_the_guard_rejects_a_wrong_rewrite_and_accepts_an_exact_one():
    assert algebra.guard(MISH, "__out = (__in1 * tanh(exp(__in1)))", X, ("__out",), "float32") is not None
    accepted = "__out = (__in1 * tanh(log1p(exp(__in1))))"
    assert algebra.guard(MISH, accepted, X, ("__out",), "float32") is None


def test_a_form_that_overflows_is_never_chosen():
    found = _analyze(MISH, form="exp")
    assert found.rewrite is None and "every rewrite loses accuracy" in found.reason and "nan" in found.reason


@pytest.mark.parametrize(
    "name, code",
    [
        ("tanh of softplus", "__out = tanh(log((dace.float32(1) + exp(__in1))))"),
        ("smish", "__out = (__in1 * tanh(log((dace.float32(1) + (float(1) / (float(1) + exp((- __in1))))))))"),
        # GELU-tanh's derivative as written before common subexpressions are shared: tanh(z) twice
        (
            "gelu-tanh backward",
            "z = (dace.float32(0.7978845608028654) * (__in1 + (dace.float32(0.044715) * (__in1 ** 3))))\n"
            "__out = ((dace.float32(0.5) * (1 + tanh(z))) + (((dace.float32(0.5) * __in1) * (1 - (tanh(z) ** 2)))"
            " * (dace.float32(0.7978845608028654) * (1 + (dace.float32(0.134145) * (__in1 ** 2))))))",
        ),
    ],
)
def test_other_activations_built_on_exp_get_one_call(name, code):
    found = _analyze(code)
    assert found.calls >= 2 and found.rewrite is not None and found.rewrite.calls == 1, found.reason


@pytest.mark.parametrize(
    "code, why",
    [
        ("__out = (__inp * (float(1) / (float(1) + exp((- __inp)))))", "at most one"),  # SiLU
        ("__out = ((dace.float32(0.5) * __in1) * (1 + tanh((__in1 + (dace.float32(0.044715) * (__in1 ** 3))))))", "at most one"),
        ("__out = log((dace.float32(1) + exp(__in1)))", "no form with fewer"),  # softplus: log and exp both stay
        ("__out = (exp(__in1) * log(__in1))", "no form with fewer"),
    ],
)
def test_what_cannot_get_cheaper_is_left_alone_with_a_reason(code, why):
    inputs = ("__inp",) if "__inp" in code else X
    found = _analyze(code, inputs)
    assert found.rewrite is None and why in found.reason


@pytest.mark.parametrize("code", ["__out = exp(__in1) if __in1 > 0 else log(__in1)", "__out = (sin(__in1) + cos(__in1))"])
def test_code_it_cannot_read_is_left_alone(code):
    found = _analyze(code)
    assert found.rewrite is None and "cannot" in found.reason
