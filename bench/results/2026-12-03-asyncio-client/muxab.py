"""A/B (recorded harness): ControllerClient (a thread and a Generate call per stream) against
AsyncControllerClient (every stream on one GenerateMany call), alternated on one deployment,
with the client's, the controller's and the worker's CPU per token.

    python muxab.py DTYPE STREAM_INTERVAL STREAMS ROUNDS
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.served import Deployment  # noqa: E402
from bench.served_path import (  # noqa: E402
    KV_BYTES,
    MANIFEST,
    MAX_NUM_BATCHED_TOKENS,
    LoopStreams,
    prompts,
    served_run,
)
from bench.workloads import MAX_MODEL_LEN, MODEL  # noqa: E402

dtype, interval, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
MAXT = 128
work = Path(tempfile.mkdtemp())
man = work / "m.yaml"
man.write_text(
    MANIFEST.format(
        model=MODEL,
        dtype=dtype,
        num_cpus=2,
        kv_bytes=KV_BYTES,
        streams=64,
        max_model_len=MAX_MODEL_LEN,
        max_batched=MAX_NUM_BATCHED_TOKENS,
        stream_interval=interval,
    )
)
texts = prompts(n)
res = {"threads": [], "asyncio": []}
with Deployment(man, work) as d:
    loop_streams = LoopStreams(d)
    served_run(d, texts[:2], 8)
    loop_streams.run(texts[:2], 8)
    for r in range(rounds):
        for mode in res:
            me0, c0, w0 = time.process_time(), d.controller_cpu_s(), d.worker_cpu_s()
            if mode == "threads":
                rate = served_run(d, texts, MAXT)[0]
            else:
                rate = loop_streams.run(texts, MAXT)[0]
            tok = n * MAXT
            me = (time.process_time() - me0) / tok * 1e6
            c = (d.controller_cpu_s() - c0) / tok * 1e6
            w = (d.worker_cpu_s() - w0) / tok * 1e6
            res[mode].append(rate)
            print(
                f"round {r} {mode:7} {rate:7.1f} tok/s  client {me:6.1f} us/tok  "
                f"controller {c:6.1f}  worker {w:6.1f}",
                flush=True,
            )
    loop_streams.close()
for m, v in res.items():
    print(m, "median", statistics.median(v))
