"""SmolLM2's 120 bf16 layer projections and its head at ROWS rows, one pass timed (medians of 9,
the three in turn, weights as the engine keeps them): our bf16 GEMM, torch's F.linear, and
oneDNN's packed matmul (PackedLinear, what prepack falls back to). Recorded harness:
`python onednn_ab.py ROWS`.
"""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402
from intentserve.worker.model.packed_linear import (  # noqa: E402
    Bf16Linear,
    PackedLinear,
    prepack_linears,
)
from intentserve.worker.model.registry import load_model  # noqa: E402

from bench.workloads import MODEL  # noqa: E402

rows = int(sys.argv[1])
model = load_model(MODEL, dtype="bfloat16").model
prepack_linears(model)
linears = [m for m in model.modules() if isinstance(m, Bf16Linear)]
weights = [lin.weight().contiguous() for lin in linears]
packed = [PackedLinear(w, None) for w in weights]
xs = {lin.in_features: torch.randn(rows, lin.in_features).bfloat16() for lin in linears}
ways = {
    "ours": lambda: [lin(xs[lin.in_features]) for lin in linears],
    "F.linear": lambda: [torch.nn.functional.linear(xs[w.shape[1]], w) for w in weights],
    "oneDNN packed": lambda: [p(xs[w.shape[1]]) for p, w in zip(packed, weights, strict=True)],
}
res: dict[str, list[float]] = {k: [] for k in ways}
for _ in range(9):
    for name, run in ways.items():
        start = time.perf_counter()
        run()
        res[name].append((time.perf_counter() - start) * 1e3)
print(rows, "rows:", {k: round(statistics.median(v), 2) for k, v in res.items()})
