"""A/B (recorded harness): the served path's client as one thread per stream (ControllerClient)
against grpc.aio streams on one event loop, a Generate call per request (the first
AsyncControllerClient, 8c8e6a8), alternated on one deployment.

    python clientab.py DTYPE STREAM_INTERVAL STREAMS ROUNDS
"""

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import grpc  # noqa: E402
from intentserve.controller.cli import credentials as credmod  # noqa: E402
from intentserve.controller.cli.client import _bearer, to_data  # noqa: E402
from intentserve.streaming import STREAM_READER_OPTIONS  # noqa: E402
from intentserve.tls import CONTROLLER, server_name  # noqa: E402
from intentserve.v1 import inference_pb2, inference_pb2_grpc  # noqa: E402

from bench.served import Deployment  # noqa: E402
from bench.served_path import (  # noqa: E402
    KV_BYTES,
    MANIFEST,
    MAX_NUM_BATCHED_TOKENS,
    prompts,
    served_run,
)
from bench.workloads import MAX_MODEL_LEN, MODEL  # noqa: E402

dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
interval = int(sys.argv[2]) if len(sys.argv) > 2 else 1
n = int(sys.argv[3]) if len(sys.argv) > 3 else 64
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
MAXT = 128
LOOP = asyncio.new_event_loop()
STATE = {}


def aio_run(d, texts, cred):
    async def one(t):
        req = inference_pb2.GenerateRequest(
            prompt=t,
            chat=True,
            sampling=inference_pb2.SamplingParams(),
            stop=inference_pb2.StopConditions(max_tokens=MAXT, ignore_eos=True),
        )
        c = 0
        async for chunk in STATE["stub"].Generate(req, timeout=600, metadata=STATE["auth"]):
            c += len(to_data(chunk)["token_ids"])
        return c

    async def main():
        if "stub" not in STATE:  # the channel is made once, then a warm-up stream
            ch = grpc.aio.secure_channel(
                d.address,
                grpc.ssl_channel_credentials(root_certificates=cred.ca_pem),
                options=[
                    ("grpc.ssl_target_name_override", server_name(cred.deployment, CONTROLLER)),
                    *STREAM_READER_OPTIONS,
                ],
            )
            STATE["stub"] = inference_pb2_grpc.InferenceStub(ch)
            STATE["auth"] = _bearer(cred.api_key or cred.admin_token)
            await one(texts[0])
            return None
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(t) for t in texts))
        el = time.perf_counter() - t0
        assert counts == [MAXT] * len(texts)
        return sum(counts) / el

    return LOOP.run_until_complete(main())


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
res = {"sync": [], "aio": []}
with Deployment(man, work) as d:
    cred = credmod.load(d.address)
    served_run(d, texts[:2], 8)
    aio_run(d, texts, cred)
    for r in range(rounds):
        for mode in ("sync", "aio"):
            me0, c0, w0 = time.process_time(), d.controller_cpu_s(), d.worker_cpu_s()
            rate = served_run(d, texts, MAXT)[0] if mode == "sync" else aio_run(d, texts, cred)
            tok = n * MAXT
            me = (time.process_time() - me0) / tok * 1e6
            c = (d.controller_cpu_s() - c0) / tok * 1e6
            w = (d.worker_cpu_s() - w0) / tok * 1e6
            res[mode].append(rate)
            print(
                f"round {r} {mode:4} {rate:7.1f} tok/s  client {me:6.1f} us/tok  "
                f"controller {c:6.1f}  worker {w:6.1f}",
                flush=True,
            )
for m, v in res.items():
    print(m, "median", statistics.median(v))
