"""Messages name modules and ops as the widget draws them (names.py), not by DaCe's spellings: what they quote of
DaCe's errors and compilers, and the steps' titles."""

from __future__ import annotations

from dace.libraries.onnx.converters import clean_onnx_name

from dcnb._src import build, errors, names
from dcnb._src.record import Step


def test_a_text_reads_the_names_dace_made_in_it_and_leaves_the_rest():
    dropout, weight = clean_onnx_name("/1/Dropout"), clean_onnx_name("ln1.weight")
    said = f"cannot read gradient_{weight} at node {dropout} (state {dropout}_map); see `{dropout}_output_0`."
    assert names.readable_text(said) == "cannot read ∇ln1.weight at node 1 · Dropout (state 1 · Dropout); see `1 · Dropout output`."
    # a word that only looks like a spelling, and names PyTorch and the user gave, stay as they are
    plain = "DOT and SLASH alone, grad x of MyModule, gradient of x, blocks.0.attn"
    assert names.readable_text(plain) == plain


def test_dace_s_errors_and_the_compiler_s_diagnostics_are_quoted_by_readable_names():
    node = clean_onnx_name("/blocks.0/attn/MatMul")
    assert errors.describe(ValueError(f"{node} has no output\nmore")) == "ValueError: blocks.0.attn · MatMul has no output"
    log = f"ninja: build stopped\nprogram.cpp:12:5: error: '{node}_output_0' was not declared in this scope\n"
    assert build._compiler_error(log) == "'blocks.0.attn · MatMul output' was not declared in this scope"


def test_a_step_is_titled_by_the_names_the_graphs_draw_and_keeps_dace_s_for_the_recipe():
    where = (clean_onnx_name("/ln1/Mul") + "_map", clean_onnx_name("ln1.weight"))
    step = Step(1, "map_fusion", {}, where, ok=False, error="map_fusion matches nothing")
    assert step.title == "map_fusion (where ln1 · Mul, ln1.weight)"
    assert step.summary == "step 1: map_fusion (where ln1 · Mul, ln1.weight) failed: map_fusion matches nothing"
    assert step.where == where and step.to_dict()["where"] == list(where)
