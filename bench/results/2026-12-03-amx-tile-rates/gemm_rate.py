"""One bf16 GEMM shape on the repo's kernel (AMX tiles where on), hot, against optional builds of
variants (each checked for the same bits): `python gemm_rate.py ROWS K N REPS [VARIANT.so ...]`;
OMP_NUM_THREADS=1 for one core. Recorded harness (the times include the Python call, ~10 us)."""

import ctypes
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import intentserve.worker.attention.cpu_kernels as ck  # noqa: E402
import torch  # noqa: E402
from intentserve.worker.model.packed_linear import Bf16Linear  # noqa: E402

rows, k, n, reps = map(int, sys.argv[1:5])
kernels = {"repo": ck.bf16_gemm_kernel()}
for path in sys.argv[5:]:
    lib = ctypes.CDLL(path)
    gemm = ck._declare(lib.bf16_gemm, ck._BF16_GEMM_ARGS, ctypes.c_int)
    kernels[Path(path).name] = ck.Bf16Gemm(gemm, ck._amx_switch(lib.bf16_gemm_amx), Path(path))
weight = torch.randn(n, k)
linears = {name: Bf16Linear(weight, None, gemm) for name, gemm in kernels.items()}
x = torch.randn(rows, k).bfloat16()
reference = linears["repo"](x)
for name, linear in linears.items():
    if not torch.equal(linear(x), reference):
        print("DIFFERS", name)
times: dict[str, list[float]] = {name: [] for name in linears}
for _ in range(5):
    for name, linear in linears.items():
        for _ in range(20):
            linear(x)
        start = time.perf_counter()
        for _ in range(reps):
            linear(x)
        times[name].append((time.perf_counter() - start) / reps)
for name, t in times.items():
    s = statistics.median(t)
    print(f"{name}: {rows} x {k} x {n}: {s * 1e6:.1f} us, {2 * rows * k * n / s / 1e9:.0f} GFLOP/s")
