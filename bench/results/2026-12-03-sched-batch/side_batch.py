"""The in-process engine's tok/s alone and beside bench/served_path.py's side load (a process
waking WAKES times per token, spinning CPU_MS per 1000 tokens in all, paced for SERVED_TOK_S): the
load in the bench's session, in a session of its own (an autogroup of its own, as the controller
and the client are), and in its own session under SCHED_BATCH; alternated (recorded harness).

    python side_batch.py DTYPE STREAMS ROUNDS CPU_MS WAKES SERVED_TOK_S
    python side_batch.py bfloat16 64 4 80 1.05 1300
"""

import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from intentserve.worker.runtime.heap import settle_heap  # noqa: E402

from bench import served_path as sp  # noqa: E402

dtype, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cpu_ms_per_1k, wakes_per_tok, served_rate = (float(a) for a in sys.argv[4:7])
engine = sp.build_engine(dtype, n)
settle_heap()
texts = sp.prompts(n)
sp.engine_run(engine, texts, 16)
work_s = cpu_ms_per_1k / 1e6 / wakes_per_tok
period_s = max(1.0 / (wakes_per_tok * served_rate) - work_s, 0.0)


def run(mode):
    if mode == "alone":
        return sp.engine_run(engine, texts, 128)[0]
    load = subprocess.Popen(
        [sys.executable, "-c", sp.SIDE_LOAD, str(period_s), str(work_s)],
        start_new_session=mode != "same",
    )
    if mode == "batch":
        os.sched_setscheduler(load.pid, os.SCHED_BATCH, os.sched_param(0))
    try:
        return sp.engine_run(engine, texts, 128)[0]
    finally:
        load.kill()
        load.wait()


modes = ["alone", "same", "session", "batch"]
res = {m: [] for m in modes}
for r in range(rounds):
    for m in modes if r % 2 == 0 else modes[::-1]:
        res[m].append(run(m))
    print(r, {m: round(v[-1], 1) for m, v in res.items()}, flush=True)
a = statistics.median(res["alone"])
print({m: round(statistics.median(v) / a, 3) for m, v in res.items()})
