"""Matrix products through a BLAS from dcnb's naive step on: a BERT-mini encoder layer (transformers' BertLayer,
hidden 256, 4 heads, FFN 1024, random weights) and an MLP, forward+backward, PyTorch eager against dcnb's naive
build calling each BLAS (``torch``: the MKL inside PyTorch's CPU library; ``openblas``: Debian's OpenMP build) and
calling none (DaCe's loops, as before), all timed in one interleaved run per model (medians, ms). Prints one JSON
line (``--json``), with the load average and the threads every candidate ran on (``torch.get_num_threads()``).
``--products`` times single products instead: MKL's GEMM (``torch.mm``/``torch.bmm``, eager's) against oneDNN's
matmul through the call generated code makes (``blas.onednn_product``), at BERT-base's shapes and below the size
from which dcnb calls oneDNN's (the best of 30 calls each, taken in turns, microseconds).

    .venv/bin/python benchmarks/blas.py --json [--models bert mlp] [--no-loops] [--budget 20]
    .venv/bin/python benchmarks/blas.py --products --json
"""

from __future__ import annotations

import argparse
import contextlib
import os

import torch
from torch import nn

import dcnb
from dcnb._src import blas, timing

from common import forward_backward, print_result


class Bert(nn.Module):
    """transformers' BertLayer at BERT-mini's size, returning its hidden states."""

    def __init__(self):
        super().__init__()
        from transformers import BertConfig
        from transformers.models.bert.modeling_bert import BertLayer

        config = BertConfig(
            hidden_size=256, num_attention_heads=4, intermediate_size=1024,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        )
        self.layer = BertLayer(config)

    def forward(self, x):
        return self.layer(x)[0]


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 256))


#: model -> (factory, input shape)
MODELS = {"bert": (Bert, (8, 128, 256)), "mlp": (_mlp, (256, 512))}


@contextlib.contextmanager
def _blas(name: str):
    old = os.environ.get("DCNB_BLAS")
    os.environ["DCNB_BLAS"] = name
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DCNB_BLAS", None)
        else:
            os.environ["DCNB_BLAS"] = old


def measure(model: str, budget: float, loops: bool) -> dict:
    make, shape = MODELS[model]
    torch.manual_seed(0)
    module = make().eval()
    x = torch.randn(*shape)
    upstream = torch.randn_like(module(x))
    sessions = {}
    for name in [*blas.available(), *(["none"] if loops else [])]:
        with _blas(name):
            sessions[name] = dcnb.optimize(module, x, baselines=(), time_budget=0.0)
    label = {name: "dcnb_loops" if name == "none" else f"dcnb_{name}_blas" for name in sessions}
    candidates = {"torch_eager": module, **{label[n]: s.module for n, s in sessions.items()}}
    times = timing.interleaved(
        {name: forward_backward(fn, x, upstream) for name, fn in candidates.items()}, budget_s=budget, warmup=2
    )
    eager = times["torch_eager"].median
    result = {f"{name}_ms": round(t.median, 3) for name, t in times.items()}
    result |= {f"{name}_vs_torch_eager": round(times[name].median / eager, 3) for name in label.values()}
    result |= {
        "allclose": all(s.current.ok and s.current.check.ok for s in sessions.values()),
        "shape": list(shape),
        "runs": min(t.runs for t in times.values()),
        "noisy": [name for name, t in times.items() if t.spread is not None and t.spread > timing.NOISY_SPREAD],
    }
    return result


#: (batch or None, m, n, k): BERT-base's products at 8x128 tokens (the projections, the FFN's two, attention's
#: batched two), then smaller ones around the size from which dcnb calls oneDNN's (blas_torch.h's ONEDNN_FROM)
PRODUCTS = [
    (None, 1024, 768, 768), (None, 1024, 3072, 768), (None, 1024, 768, 3072), (96, 128, 128, 64), (96, 128, 64, 128),
    (None, 256, 256, 256), (None, 128, 128, 128), (None, 128, 128, 64), (None, 64, 64, 64), (None, 8, 32, 32),
]  # fmt: skip


def products(rounds: int = 30) -> dict:
    """Each product of PRODUCTS through MKL and through oneDNN: the best time of ``rounds`` calls each, in turns after
    one that sets each up."""
    result = {}
    for batch, m, n, k in PRODUCTS:
        lead = () if batch is None else (batch,)
        a, b, out = torch.rand(*lead, m, k), torch.rand(*lead, k, n), torch.empty(*lead, m, n)
        mkl = (lambda: torch.mm(a, b, out=out)) if batch is None else (lambda: torch.bmm(a, b, out=out))
        calls = {"mkl": mkl, "onednn": lambda: blas.onednn_product(a, b, out)}
        times = timing.interleaved(calls, warmup=1, min_runs=rounds, max_runs=rounds)
        best = {name: t.min for name, t in times.items()}
        torch.testing.assert_close(out, a @ b, rtol=1e-5, atol=1e-5)  # (different summation orders)
        result[f"{'' if batch is None else f'{batch}x'}{m}x{n}x{k}"] = {
            "mkl_us": round(best["mkl"] * 1e3, 1),
            "onednn_us": round(best["onednn"] * 1e3, 1),
            "onednn_vs_mkl": round(best["onednn"] / best["mkl"], 3),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--budget", type=float, default=20.0, help="seconds for each interleaved timing run")
    parser.add_argument("--no-loops", action="store_true", help="leave out dcnb without a BLAS (slow to time)")
    parser.add_argument("--products", action="store_true", help="time single products, MKL's against oneDNN's")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    result = {"threads": torch.get_num_threads(), "load_before": round(os.getloadavg()[0], 2)}
    if args.products:
        result |= {"cpu": _cpu(), "products": products()}
    for model in [] if args.products else args.models:
        result[model] = measure(model, args.budget, not args.no_loops)
    result["load_after"] = round(os.getloadavg()[0], 2)
    print_result(result, args.json)


def _cpu() -> str:
    """The CPU's model name, as the kernel reports it."""
    with open("/proc/cpuinfo") as info:
        return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "unknown")


if __name__ == "__main__":
    main()
