"""A/B (recorded harness): the blocking client's streams on a Generate call each (what
ControllerClient did before bdf11d9, rebuilt here from the stub: a thread and a call per stream)
against ControllerClient now (every stream on one GenerateMany call) and AsyncControllerClient,
alternated on one deployment, with the client's, the controller's and the worker's CPU per token.

    python callab.py DTYPE STREAMS ROUNDS
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from intentserve.controller.cli.client import (  # noqa: E402
    ControllerClient,
    _bearer,
    generate_request,
    open_channel,
    to_data,
)
from intentserve.v1 import inference_pb2_grpc  # noqa: E402

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


class CallPerStream:
    """`generate` as the blocking client had it: one Generate call per stream."""

    def __init__(self, address, credentials) -> None:
        self._channel = open_channel(address, credentials)
        self._stub = inference_pb2_grpc.InferenceStub(self._channel)
        self._auth = _bearer(credentials.api_key or credentials.admin_token)

    def generate(self, prompt, *, chat, max_tokens, ignore_eos, timeout_s):
        request = generate_request(
            prompt,
            chat=chat,
            max_tokens=max_tokens,
            temperature=0.0,
            top_k=0,
            top_p=0.0,
            seed=None,
            stop=None,
            ignore_eos=ignore_eos,
        )
        for chunk in self._stub.Generate(request, timeout=timeout_s, metadata=self._auth):
            yield to_data(chunk)

    def close(self) -> None:
        self._channel.close()


dtype, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
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
        stream_interval=1,
    )
)
texts = prompts(n)
res = {"call_per_stream": [], "shared_call": [], "asyncio": []}
with Deployment(man, work) as d:
    clients = {
        "call_per_stream": CallPerStream(d.address, d.credentials),
        "shared_call": ControllerClient(d.address, timeout_s=30, credentials=d.credentials),
    }
    loop_streams = LoopStreams(d)
    own = d.client
    for client in clients.values():
        d.client = client
        served_run(d, texts[:2], 8)
    loop_streams.run(texts[:2], 8)
    for r in range(rounds):
        for mode in res:
            me0, c0, w0 = time.process_time(), d.controller_cpu_s(), d.worker_cpu_s()
            if mode == "asyncio":
                rate = loop_streams.run(texts, MAXT)[0]
            else:
                d.client = clients[mode]
                rate = served_run(d, texts, MAXT)[0]
            tok = n * MAXT
            me = (time.process_time() - me0) / tok * 1e6
            c = (d.controller_cpu_s() - c0) / tok * 1e6
            w = (d.worker_cpu_s() - w0) / tok * 1e6
            res[mode].append(rate)
            print(
                f"round {r} {mode:15} {rate:7.1f} tok/s  client {me:6.1f} us/tok  "
                f"controller {c:6.1f}  worker {w:6.1f}",
                flush=True,
            )
    d.client = own
    loop_streams.close()
    for client in clients.values():
        client.close()
for m, v in res.items():
    print(m, "median", statistics.median(v))
