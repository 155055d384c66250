"""The 64-stream bf16 engine alone and beside a side load, alternated in one process; run once
per libgomp setting (GOMP_SPINCOUNT, OMP_WAIT_POLICY are read when the process starts).

    python spin.py STREAMS ROUNDS CPU_MS_PER_1K_TOKENS WAKEUPS_PER_TOKEN    # e.g. 64 3 80 2
"""

import statistics
import sys

from intentserve.worker.runtime.heap import settle_heap

from bench import served_path as sp

streams, rounds = int(sys.argv[1]), int(sys.argv[2])
cpu_ms_per_1k, wakeups = float(sys.argv[3]), float(sys.argv[4])
engine = sp.build_engine("bfloat16", 64)
settle_heap()
texts = sp.prompts(64)[:streams]
sp.engine_run(engine, texts[:2], 8)  # warm-up
alone, loaded = [], []
for _ in range(rounds):
    rate, _texts = sp.engine_run(engine, texts, 128)
    alone.append(rate)
    loaded.append(sp.side_load_run(engine, texts, 128, rate, cpu_ms_per_1k, wakeups))
ratios = [b / a for a, b in zip(alone, loaded, strict=True)]
print(
    f"alone {statistics.median(alone):.1f} loaded {statistics.median(loaded):.1f} "
    f"ratio {statistics.median(ratios):.3f} rounds {[round(r, 3) for r in ratios]}"
)
