"""A/B (recorded harness): float32 engines with f32_gemm.c as grouped now against the kernel and
packing before (blocks order, built from `git show 374fd2e:worker/attention/cpu_kernels/
f32_gemm.c` into OLD_SO), alternated round by round in one process; medians of the decode steps,
and the per-round ratio. The greedy tokens of the two engines are checked equal every round.

    gcc -O3 -march=native -fopenmp -shared -fPIC -std=gnu11 -o f32_old.so f32_gemm_old.c
    python ab_f32.py STREAMS ROUNDS
"""

import ctypes
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import intentserve.worker.attention.cpu_kernels as ck  # noqa: E402
import intentserve.worker.model.decode_layers as dl  # noqa: E402
import intentserve.worker.model.packed_linear as pl  # noqa: E402
import torch  # noqa: E402
from intentserve.worker.engine.sampling import SamplingParams  # noqa: E402
from intentserve.worker.runtime.heap import settle_heap  # noqa: E402

from bench.workloads import MAX_MODEL_LEN, PROMPTS, _bytes_per_token, _engine, load_models  # noqa: E402

OLD_SO = Path("/tmp/f32old/f32_old.so")
n, rounds = int(sys.argv[1]), int(sys.argv[2])
lib = ctypes.CDLL(str(OLD_SO))
old = ck.F32Gemm(ck._declare(lib.f32_gemm, ck._BF16_GEMM_ARGS, ctypes.c_int), OLD_SO)


class OldF32Linear(pl.F32Linear):
    def _pack(self, weight):
        w = weight.float()
        return w.reshape(self.out_features // 16, 16, self.in_features).transpose(1, 2).contiguous()

    def weight(self):
        return self.packed.transpose(1, 2).reshape(self.out_features, self.in_features)


engines = {}
for name in ("grouped", "blocks"):
    if name == "blocks":
        pl.F32Linear = OldF32Linear
        pl.f32_gemm_kernel = lambda: old
        dl.f32_gemm_kernel = lambda: old
    models = load_models(torch.float32, False)
    engines[name] = _engine(models, "paged", n, n * MAX_MODEL_LEN * _bytes_per_token(models))
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
    tokens[name] = [o.new_token_ids for o in outputs]
    return statistics.median(times) * 1e3


res: dict[str, list[float]] = {k: [] for k in engines}
for r in range(rounds):
    for name in list(engines) if r % 2 == 0 else list(engines)[::-1]:
        res[name].append(step_ms(name))
    assert tokens["grouped"] == tokens["blocks"]
    print(r, {k: round(v[-1], 3) for k, v in res.items()}, flush=True)
ratios = [a / b for a, b in zip(res["grouped"], res["blocks"], strict=True)]
medians = {k: round(statistics.median(v), 3) for k, v in res.items()}
faster = sum(r < 1 for r in ratios)
print(medians, "per-round grouped/blocks", round(statistics.median(ratios), 3), "faster", faster)
