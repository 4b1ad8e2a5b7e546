"""Embeddings: nn.Embedding's padding row, which ONNX's Gather cannot express."""

from __future__ import annotations

import dace


def zero_padding_rows(backward: dace.SDFG, rows: dict[str, int]) -> None:
    """Zero row ``rows[name]`` of each gradient array ``name`` at the end of the backward.

    gap: an nn.Embedding with ``padding_idx`` exports to a plain Gather, so DaCe's backward adds the padding
    tokens' gradients into the padding row, which PyTorch leaves at zero (BERT's word embeddings have one).
    """
    if not rows:
        return
    [last] = [s for s in backward.states() if backward.out_degree(s) == 0]
    state = backward.add_state_after(last, "padding_rows")
    for name, row in rows.items():
        columns = backward.arrays[name].shape[1:]
        params = [f"__p{i}" for i in range(len(columns))]
        state.add_mapped_tasklet(
            f"zero_padding_row_{name}",
            {p: f"0:{s}" for p, s in zip(params, columns)} or {"__p": "0:1"},
            {},
            "__out = 0",
            {"__out": dace.Memlet(f"{name}[{', '.join([str(row), *params])}]")},
            external_edges=True,
        )
