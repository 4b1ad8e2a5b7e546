"""Array ops: Expand (broadcasting to a shape)."""

from __future__ import annotations

import copy

import dace
from dace import data as dt
from dace.libraries.onnx.forward_implementation_abc import ONNXForward
from dace.sdfg.utils import in_desc_with_name, out_desc_with_name
from dace.transformation.onnx import constant_folding

from .registry import pure_expansion


def broadcast_index(desc: dt.Data, out_shape: list, out_index: list[str]) -> list[str]:
    """The index into ``desc`` that numpy-style broadcasting reads for output element ``out_index``."""
    if isinstance(desc, dt.Scalar):
        return []
    offset = len(out_shape) - len(desc.shape)
    return ["0" if int(size) == 1 else out_index[offset + i] for i, size in enumerate(desc.shape)]


@pure_expansion("Expand", name="dcnb")
class ExpandExpansion(ONNXForward):
    # gap: DaCe registers two "pure" Expands under one name, so only the one for an unchanged shape remains, and the
    # other assigns to a local name instead of the output: every broadcasting Expand (``cls_token.expand(n, -1,
    # -1)``, and ReduceSum's backward rule) failed to generate code ("Node expansion must be a CodeNode or an SDFG")
    @staticmethod
    def forward(node, state, sdfg):
        x = copy.deepcopy(in_desc_with_name(node, state, sdfg, "input"))
        y = copy.deepcopy(out_desc_with_name(node, state, sdfg, "output"))
        # the target shape is in the output's descriptor: its input and what computes it are not needed
        constant_folding.remove_node_and_computation(sdfg, state, node, "shape")
        nsdfg = dace.SDFG(f"{node.label}_expansion")
        for name, desc in (("input", x), ("output", y)):
            desc.transient = False
            nsdfg.add_datadesc(name, desc)
        params = [f"__i{i}" for i in range(len(y.shape))]
        read = ", ".join(broadcast_index(x, list(y.shape), params)) or "0"
        nsdfg.add_state().add_mapped_tasklet(
            f"{node.label}_broadcast",
            {p: f"0:{s}" for p, s in zip(params, y.shape)},
            {"__in": dace.Memlet(f"input[{read}]")},
            "__out = __in",
            {"__out": dace.Memlet(f"output[{', '.join(params)}]")},
            external_edges=True,
        )
        return nsdfg
