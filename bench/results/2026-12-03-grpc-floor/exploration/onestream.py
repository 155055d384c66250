# ruff: noqa  (a harness recorded as it was run, for the figures in NOTES.md)
"""Where one served stream's CPU goes: every process's CPU over an idle window and over
one-stream runs (bf16), per token."""

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, "/work/main")
from bench.served import Deployment, cpu_s
from bench.served_path import (
    KV_BYTES,
    MANIFEST,
    MAX_NUM_BATCHED_TOKENS,
    LoopStreams,
    prompts,
    served_run,
)
from bench.workloads import MAX_MODEL_LEN, MODEL


def all_procs():
    out = {}
    for e in Path("/proc").iterdir():
        if e.name.isdigit():
            with contextlib.suppress(OSError):
                title = (e / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")[:40]
                out[int(e.name)] = (title, cpu_s(int(e.name)))
    return out


def delta(a, b):
    d = {}
    for pid, (title, t) in b.items():
        if pid in a:
            dt = t - a[pid][1]
            if dt > 0.005:
                d[f"{pid} {title}"] = dt
    return dict(sorted(d.items(), key=lambda kv: -kv[1]))


dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
client_kind = sys.argv[2] if len(sys.argv) > 2 else "threads"
work = Path(tempfile.mkdtemp())
m = work / "m.yaml"
m.write_text(
    MANIFEST.format(
        model=MODEL,
        dtype=dtype,
        num_cpus=2,
        kv_bytes=KV_BYTES,
        streams=64,
        max_model_len=MAX_MODEL_LEN,
        max_batched=MAX_NUM_BATCHED_TOKENS,
        stream_interval=1,
    )
)
engine = None
if os.environ.get("ENGINE"):
    import torch

    torch.set_num_threads(2)
    from bench.served_path import build_engine, engine_run

    engine = build_engine(dtype, 64)
with Deployment(m, work) as d:
    texts = prompts(1)
    loop = LoopStreams(d) if client_kind == "asyncio" else None
    run = (lambda t, n: loop.run(t, n)) if loop else (lambda t, n: served_run(d, t, n))
    run(texts, 16)
    time.sleep(2)
    a = all_procs()
    t0 = time.process_time()
    time.sleep(10)
    b = all_procs()
    print(
        "idle 10 s, CPU s:",
        {k: round(v, 3) for k, v in delta(a, b).items()},
        "bench",
        round(time.process_time() - t0, 3),
    )
    import subprocess

    ctrl = d.pid
    perfs = []
    if os.environ.get("SPY"):
        perfs.append(
            subprocess.Popen(
                [
                    "/tmp/tools/bin/py-spy",
                    "record",
                    "-r",
                    "400",
                    "-p",
                    str(ctrl),
                    "-f",
                    "raw",
                    "-o",
                    "/tmp/exp/ctrl.spy",
                    "--threads",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        time.sleep(1)
    if os.environ.get("PERF"):
        perfs.append(
            subprocess.Popen(
                [
                    "perf",
                    "stat",
                    "-e",
                    "task-clock,context-switches,cpu-migrations,page-faults",
                    "-p",
                    f"{ctrl},{os.getpid()}",
                    "--per-thread",
                    "-o",
                    "/tmp/exp/stat.txt",
                ]
            )
        )
        perfs.append(
            subprocess.Popen(
                ["perf", "record", "-F", "1999", "-g", "-p", str(ctrl), "-o", "/tmp/exp/ctrl.data"],
                stderr=subprocess.DEVNULL,
            )
        )
        time.sleep(1)
    for rnd in range(int(os.environ.get("ROUNDS", 3))):
        if engine is not None:
            engine_run(engine, texts, 128)
        a = all_procs()
        t0 = time.process_time()
        w0 = time.perf_counter()
        rate, _ = run(texts, 128)
        wall = time.perf_counter() - w0
        b = all_procs()
        bench = time.process_time() - t0
        per = {k: round(v * 1e6 / 128, 0) for k, v in delta(a, b).items()}
        print(
            f"round {rnd}: {rate:.1f} tok/s wall {wall:.2f}s; us CPU per token: bench {bench * 1e6 / 128:.0f}",
            per,
        )
    for p in perfs:
        p.send_signal(2)
        p.wait()
    if loop:
        loop.close()
