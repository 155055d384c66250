"""Served / engine with the `up` process's threads (the controller and its front ends) at nice 0
and at nice N, alternated in one deployment (recorded harness; root may renice either way).

    python nice_served.py DTYPE NICENESS ROUNDS CONCURRENCY    # e.g. bfloat16 19 3 1,64
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

dtype, niceness, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
concurrency = [int(c) for c in sys.argv[4].split(",")]
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


def renice(pid: int, value: int) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.setpriority(os.PRIO_PROCESS, int(tid), value)


res: dict[int, list[list[float]]] = {}
with Deployment(manifest, work) as d:
    sp.engine_run(engine, texts[:2], 8)
    sp.served_run(d, texts[:2], 8)
    for r in range(rounds):
        for n in concurrency:
            rate = sp.engine_run(engine, texts[:n], 128)[0]
            ratios = []
            for value in (0, niceness):
                renice(d.pid, value)
                ratios.append(sp.served_run(d, texts[:n], 128)[0] / rate)
            res.setdefault(n, []).append(ratios)
            print(r, n, f"engine {rate:.1f} nice0 {ratios[0]:.3f} nice{niceness} {ratios[1]:.3f}")
for n, rows in res.items():
    at0 = statistics.median(x[0] for x in rows)
    at_n = statistics.median(x[1] for x in rows)
    print(n, "median nice0", round(at0, 3), f"nice{niceness}", round(at_n, 3))
