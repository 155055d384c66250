"""A/B (recorded harness): bf16 engines with the projections packed grouped (the default where
the GEMMs run on AVX512-BF16) against in blocks (the order AMX tiles read), alternated round by
round in one process; medians of the decode steps.

    python ab_layout.py STREAMS ROUNDS
"""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402
from intentserve.worker.engine.sampling import SamplingParams  # noqa: E402
from intentserve.worker.model.packed_linear import Bf16Linear  # noqa: E402
from intentserve.worker.runtime.heap import settle_heap  # noqa: E402

from bench.workloads import MAX_MODEL_LEN, PROMPTS, _bytes_per_token, _engine, load_models  # noqa: E402

n, rounds = int(sys.argv[1]), int(sys.argv[2])
engines = {}
for name in ("grouped", "blocks"):
    if name == "blocks":
        Bf16Linear._grouped = staticmethod(lambda gemm: False)
    models = load_models(torch.bfloat16, False)
    engines[name] = _engine(models, "paged", n, n * MAX_MODEL_LEN * _bytes_per_token(models))
    assert engines[name].runner.model.layers[0].mlp.down_proj.grouped == (name == "grouped")
    engines[name].generate([PROMPTS[0]], SamplingParams(max_tokens=4))
settle_heap()


def step_ms(engine) -> float:
    for i in range(n):
        params = SamplingParams(max_tokens=66, ignore_eos=True)
        engine.add_request(PROMPTS[(i + 1) % len(PROMPTS)], params)
    engine.step()  # the prefill
    times = []
    while engine.has_unfinished:
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


res: dict[str, list[float]] = {k: [] for k in engines}
for r in range(rounds):
    for name in list(engines) if r % 2 == 0 else list(engines)[::-1]:
        res[name].append(step_ms(engines[name]))
    print(r, {k: round(v[-1], 3) for k, v in res.items()}, flush=True)
medians = {k: statistics.median(v) for k, v in res.items()}
ratio = medians["grouped"] / medians["blocks"]
print({k: round(v, 3) for k, v in medians.items()}, "grouped/blocks", ratio)
