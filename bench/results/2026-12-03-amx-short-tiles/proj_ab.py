"""SmolLM2's 120 bf16 layer projections and its head at ROWS rows, one pass over them timed,
alternated in one process between the repo's bf16 GEMM and kernels built from variants of it
(recorded harness): `python proj_ab.py ROWS ROUNDS [--hot] [VARIANT.so ...]`. Cold (the default):
64 MB written between passes. The variants here: AMX_AHEAD 2048 / 8192 / 16384 in amx.h, and
packed_x.patch (x packed per call), each built with
`gcc -O3 -march=native -fopenmp -shared -fPIC -std=gnu11 -o VARIANT.so bf16_gemm.c`.
"""

import ctypes
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import intentserve.worker.attention.cpu_kernels as ck  # noqa: E402
import torch  # noqa: E402
from intentserve.worker.model.packed_linear import Bf16Linear, prepack_linears  # noqa: E402
from intentserve.worker.model.registry import load_model  # noqa: E402

from bench.workloads import MODEL  # noqa: E402

rows, rounds = int(sys.argv[1]), int(sys.argv[2])
hot = "--hot" in sys.argv[3:]
libs = {"repo": ck.bf16_gemm_kernel()}
for path in (a for a in sys.argv[3:] if a != "--hot"):
    lib = ctypes.CDLL(path)
    gemm = ck._declare(lib.bf16_gemm, ck._BF16_GEMM_ARGS, ctypes.c_int)
    libs[Path(path).name] = ck.Bf16Gemm(gemm, ck._amx_switch(lib.bf16_gemm_amx), Path(path))
model = load_model(MODEL, dtype="bfloat16").model
prepack_linears(model)
linears = [m for m in model.modules() if isinstance(m, Bf16Linear)]
xs = {lin.in_features: torch.randn(rows, lin.in_features).bfloat16() for lin in linears}
flush = torch.empty(64 << 20, dtype=torch.uint8)


def one_pass(kernel) -> float:
    for lin in linears:
        lin.gemm = kernel
    if not hot:
        flush.add_(1)  # the weights out of the caches (of those this size)
    start = time.perf_counter()
    for lin in linears:
        lin(xs[lin.in_features])
    return (time.perf_counter() - start) * 1e3


res: dict[str, list[float]] = {k: [] for k in libs}
for r in range(rounds):
    for name in list(libs) if r % 2 == 0 else list(libs)[::-1]:
        res[name].append(one_pass(libs[name]))
print(len(linears), "matmuls;", {k: round(statistics.median(v), 2) for k, v in res.items()})
