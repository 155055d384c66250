"""A/B (recorded harness): bf16 engines (FORMAT "dequantized": bf16_gemm.c; "w8a8":
int8_gemm.c) on AMX tiles, the tiles that hold x and the sums as short as a call's rows where it
has under 16 (now) against always 16 rows tall (the kernel before, built from `git show
01735e4:worker/attention/cpu_kernels/...` with its headers into /tmp/s36/old), alternated round
by round in one process; medians of the decode steps and the per-round ratio. The greedy tokens
of the two engines are checked equal every round.

    gcc -O3 -march=native -fopenmp -shared -fPIC -std=gnu11 -o bf16_old.so bf16_gemm.c
    gcc -O3 -march=native -fopenmp -shared -fPIC -std=gnu11 -o int8_old.so int8_gemm.c
    python ab_tiles.py FORMAT STREAMS ROUNDS
"""

import ctypes
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import intentserve.worker.attention.cpu_kernels as ck  # noqa: E402
import intentserve.worker.model.cpu_ops as co  # noqa: E402
import intentserve.worker.model.decode_layers as dl  # noqa: E402
import intentserve.worker.model.packed_linear as pl  # noqa: E402
from intentserve.worker.engine.sampling import SamplingParams  # noqa: E402
from intentserve.worker.runtime.heap import settle_heap  # noqa: E402

from bench.weights import engine as weights_engine  # noqa: E402
from bench.workloads import MODEL, PROMPTS, Models, load_model  # noqa: E402

OLD = Path("/tmp/s36/old")
fmt, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if fmt == "w8a8":
    lib = ctypes.CDLL(str(OLD / "int8_old.so"))
    old = ck.Int8Gemm(
        ck._declare(lib.int8_gemm_f32, ck._INT8_GEMM_ARGS, ctypes.c_int),
        ck._declare(lib.int8_gemm_bf16, ck._INT8_GEMM_ARGS, ctypes.c_int),
        ck._declare(lib.w8a8_linear_f32, ck._W8A8_LINEAR_ARGS, ctypes.c_int),
        ck._declare(lib.w8a8_linear_bf16, ck._W8A8_LINEAR_ARGS, ctypes.c_int),
        ck._amx_switch(lib.int8_gemm_amx),
        OLD / "int8_old.so",
    )
    new = ck.int8_gemm_kernel()
else:
    lib = ctypes.CDLL(str(OLD / "bf16_old.so"))
    old = ck.Bf16Gemm(
        ck._declare(lib.bf16_gemm, ck._BF16_GEMM_ARGS, ctypes.c_int),
        ck._amx_switch(lib.bf16_gemm_amx),
        OLD / "bf16_old.so",
    )
    new = ck.bf16_gemm_kernel()
assert new.amx(-1) == 1 and old.amx(-1) == 1, "this A/B needs AMX"

engines = {}
for name in ("short", "tall"):
    if name == "tall":
        name_of = "int8_gemm_kernel" if fmt == "w8a8" else "bf16_gemm_kernel"
        for module in (pl, dl, co):
            setattr(module, name_of, lambda: old)
    models = Models(load_model(MODEL, dtype="bfloat16"), None)
    engines[name] = weights_engine(models, fmt, n)
    engines[name].generate([PROMPTS[0]], SamplingParams(max_tokens=4))
settle_heap()
tokens = {}


def step_ms(name: str) -> float:
    engine = engines[name]
    for i in range(n):
        params = SamplingParams(max_tokens=66, ignore_eos=True)
        engine.add_request(PROMPTS[(i + 1) % len(PROMPTS)], params)
    engine.step()  # the prefill
    times, outputs = [], []
    while engine.has_unfinished:
        start = time.perf_counter()
        outputs += engine.step()
        times.append(time.perf_counter() - start)
    tokens[name] = sorted(o.new_token_ids for o in outputs)
    return statistics.median(times) * 1e3


res: dict[str, list[float]] = {k: [] for k in engines}
for r in range(rounds):
    for name in list(engines) if r % 2 == 0 else list(engines)[::-1]:
        res[name].append(step_ms(name))
    assert tokens["short"] == tokens["tall"]
    print(r, {k: round(v[-1], 3) for k, v in res.items()}, flush=True)
ratios = [a / b for a, b in zip(res["short"], res["tall"], strict=True)]
medians = {k: round(statistics.median(v), 3) for k, v in res.items()}
faster = sum(r < 1 for r in ratios)
print(medians, "per-round short/tall", round(statistics.median(ratios), 3), "faster", faster)
