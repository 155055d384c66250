import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch

from bench.served import Deployment
from bench.served_path import KV_BYTES, MANIFEST, MAX_NUM_BATCHED_TOKENS, prompts
from bench.workloads import MAX_MODEL_LEN, MODEL

torch.set_num_threads(2)
work = Path(tempfile.mkdtemp())
os.environ["INTENTSERVE_HOME"] = str(work / "home")
m = work / "m.yaml"
m.write_text(
    MANIFEST.format(
        model=MODEL,
        dtype="bfloat16",
        num_cpus=2,
        kv_bytes=KV_BYTES,
        streams=64,
        max_model_len=MAX_MODEL_LEN,
        max_batched=MAX_NUM_BATCHED_TOKENS,
        stream_interval=4,
    )
)
texts = prompts(64)
with Deployment(m, work) as d:

    def run(n):
        first = [None] * n
        last = [None] * n
        sent = [None] * n

        def one(i):
            sent[i] = time.perf_counter()
            for _c in d.client.generate(
                texts[i], chat=True, max_tokens=128, ignore_eos=True, timeout_s=600
            ):
                if first[i] is None:
                    first[i] = time.perf_counter()
            last[i] = time.perf_counter()

        ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        el = time.perf_counter() - t0
        f = sorted(x - t0 for x in first)
        s = sorted(x - t0 for x in sent)
        e = sorted(x - t0 for x in last)
        print(
            f"n={n} {n * 128 / el:.0f} tok/s; sent {s[0] * 1e3:.0f}-{s[-1] * 1e3:.0f} ms; "
            f"first token {f[0] * 1e3:.0f}/{f[n // 2] * 1e3:.0f}/{f[-1] * 1e3:.0f} ms; "
            f"last {e[0] * 1e3:.0f}/{e[-1] * 1e3:.0f} ms",
            flush=True,
        )

    run(2)
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        run(64)
