"""Served / engine with the `up` process's threads (the controller and its front ends) under
SCHED_OTHER and under SCHED_BATCH (no preemption on wake-up), alternated in one deployment
(recorded harness; root may set either policy).

    python batch_served.py DTYPE ROUNDS CONCURRENCY    # e.g. bfloat16 3 1,32,64
"""

import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from intentserve.worker.runtime.heap import settle_heap  # noqa: E402

from bench import served_path as sp  # noqa: E402
from bench.served import Deployment  # noqa: E402

dtype, rounds = sys.argv[1], int(sys.argv[2])
concurrency = [int(c) for c in sys.argv[3].split(",")]
work = Path(tempfile.mkdtemp())
streams = max(concurrency)
manifest = work / "m.yaml"
manifest.write_text(
    sp.MANIFEST.format(
        model=sp.MODEL,
        dtype=dtype,
        num_cpus=2,
        kv_bytes=sp.KV_BYTES,
        streams=streams,
        max_model_len=sp.MAX_MODEL_LEN,
        max_batched=sp.MAX_NUM_BATCHED_TOKENS,
        stream_interval=1,
    )
)
engine = sp.build_engine(dtype, streams)
settle_heap()
texts = sp.prompts(streams)


POLICIES = {"other": os.SCHED_OTHER, "batch": os.SCHED_BATCH}


def set_policy(pid: int, name: str) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setscheduler(int(tid), POLICIES[name], os.sched_param(0))


res: dict[int, list[list[float]]] = {}
with Deployment(manifest, work) as d:
    sp.engine_run(engine, texts[:2], 8)
    sp.served_run(d, texts[:2], 8)
    for r in range(rounds):
        for n in concurrency:
            rate = sp.engine_run(engine, texts[:n], 128)[0]
            ratios = []
            for name in POLICIES if r % 2 == 0 else list(POLICIES)[::-1]:
                set_policy(d.pid, name)
                ratios.append(sp.served_run(d, texts[:n], 128)[0] / rate)
            if r % 2:
                ratios.reverse()
            res.setdefault(n, []).append(ratios)
            line = f"engine {rate:.1f} other {ratios[0]:.3f} batch {ratios[1]:.3f}"
            print(r, n, line, flush=True)
for n, rows in res.items():
    other = statistics.median(x[0] for x in rows)
    batch = statistics.median(x[1] for x in rows)
    print(n, "median other", round(other, 3), "batch", round(batch, 3))
