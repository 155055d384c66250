"""In one process: engine.generate against the worker's EngineLoop + Outbox (the mux path, no
gRPC), same engine, alternated rounds. Says how much of served/engine the loop itself costs."""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch
from intentserve.worker.engine.chat import Conversation
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.runtime.heap import settle_heap
from intentserve.worker.service.engine_loop import EngineLoop
from intentserve.worker.service.request_stream import Outbox

from bench.served_path import build_engine, engine_run, prompts

torch.set_num_threads(2)
n = int(sys.argv[1])
rounds = int(sys.argv[2])
interval = int(sys.argv[3]) if len(sys.argv) > 3 else 1
engine = build_engine("bfloat16", 64)
settle_heap()
texts = prompts(64)[:n]
loop = EngineLoop(engine, stream_interval=interval)
params = SamplingParams(max_tokens=128, ignore_eos=True)


def loop_run():
    outbox = Outbox()
    start = time.perf_counter()
    for key, t in enumerate(texts):
        prepared = engine.prepare(Conversation.user(t), params, None, chat=False)
        loop.start(prepared, outbox, key)
    done = 0
    count = 0
    while done < n:
        batch = outbox.get()
        for _, item in batch:
            count += len(item.new_token_ids)
            done += item.finished
    el = time.perf_counter() - start
    assert count == n * 128, count
    return count / el


engine_run(engine, texts[:2], 8)
loop_run()
a, b = [], []
for r in range(rounds):
    a.append(engine_run(engine, texts, 128)[0])
    b.append(loop_run())
    print(f"round {r}: generate {a[-1]:.1f} loop {b[-1]:.1f} ratio {b[-1] / a[-1]:.3f}", flush=True)
print(
    f"n={n} medians generate {statistics.median(a):.1f} loop {statistics.median(b):.1f} "
    f"ratio {statistics.median(b) / statistics.median(a):.3f}"
)
loop.close()
