# ruff: noqa  (a harness recorded as it was run, for the figures in NOTES.md)
import statistics
import sys
import time

sys.path.insert(0, "/work/main")
import torch

torch.set_num_threads(2)
from intentserve.worker.runtime.heap import settle_heap

from bench.grpc_floor import Chain
from bench.served_path import build_engine, engine_run, prompts

dtype = sys.argv[1]
engine = build_engine(dtype, 64)
settle_heap()
texts = prompts(1)
engine_run(engine, texts, 8)
alone, beside = [], []
with Chain() as chain:
    for r in range(int(sys.argv[2])):
        rate, _ = engine_run(engine, texts, 128)
        alone.append(rate)
        period = 1 / rate
        proc = chain.stream(int(128 * 1.3), period)
        time.sleep(0.3)
        rate2, _ = engine_run(engine, texts, 128)
        beside.append(rate2)
        f = chain.result(proc, 60)
        print(
            f"round {r}: alone {rate:.1f} beside chain {rate2:.1f} ratio {rate2 / rate:.3f}; chain us/msg relay {f['relay_us']:.0f} client {f['client_us']:.0f} upstream {f['upstream_us']:.0f}",
            flush=True,
        )
print("median ratio", statistics.median(b / a for a, b in zip(alone, beside)))
