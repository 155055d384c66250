"""bench/relay.py and its simulated workers: the workers pass the controller's mutual TLS and
verification as real ones do and stream at their pace through it; the benchmark, at a tiny size,
counts every token through the relay and straight from a worker."""

from __future__ import annotations

import argparse
import json
import math

import grpc
import pytest
from intentserve.common.tls import TlsIdentity, secure_channel
from intentserve.v1 import inference_pb2, inference_pb2_grpc

from bench.relay_fleet import SimWorkers, start_controller
from tests.bench_script import run_bench

pytestmark = pytest.mark.integration

FLEET = argparse.Namespace(step_ms=10.0, tokens_per_step=3, worker_procs=1)


@pytest.fixture
def fleet(tmp_path):
    front = start_controller(tmp_path, "sim", 2)
    workers = None
    try:
        workers = SimWorkers(front, 2, 4, FLEET)
        front.wait_serving()  # both verified: their realized reports were accepted
        credentials = grpc.ssl_channel_credentials(front.pki.ca_file.read_bytes())
        options = [("grpc.ssl_target_name_override", front.server_name)]
        with grpc.secure_channel(front.address, credentials, options=options) as channel:
            yield inference_pb2_grpc.InferenceStub(channel), workers, front
    finally:
        if workers is not None:
            workers.stop()
        front.stop()


def generate(stub, max_tokens: int) -> list[inference_pb2.GenerateResponse]:
    return list(generate_call(stub, max_tokens))


def test_simulated_workers_register_verify_and_stream_their_steps_through_the_controller(fleet):
    stub, workers, _ = fleet
    assert [worker_id for worker_id, _ in workers.addresses] == ["sim-0", "sim-1"]
    served_by = set()
    for _ in range(4):
        responses = generate(stub, 7)
        # three tokens a step; steps that wait in the router may leave it as one message
        ends = [r.num_output_tokens for r in responses]
        assert set(ends) <= {3, 6, 7} and ends[-1] == 7, ends
        assert sum(len(r.token_ids) for r in responses) == 7
        assert responses[-1].finish_reason == inference_pb2.FINISH_REASON_LENGTH
        served_by.add(responses[0].worker_id)
    assert served_by <= {"sim-0", "sim-1"}


def test_a_simulated_worker_refuses_a_bad_field_by_name(fleet):
    stub, _, _ = fleet
    with pytest.raises(grpc.RpcError) as refused:
        generate(stub, 0)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_tokens" in refused.value.details()


def test_a_call_cancelled_on_a_worker_ends_only_itself(fleet):
    """Every request waits on the worker's one clock: a cancelled call must leave it ticking."""
    _, workers, front = fleet
    worker_id, address = workers.addresses[0]
    identity = TlsIdentity.from_dict(json.loads(front.pki.identity("client").read_text()))
    with secure_channel(address, identity, front.pki.server_name(worker_id)) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        doomed = iter(generate_call(stub, 500))
        next(doomed)
        survivor = generate_call(stub, 20)
        doomed.cancel()
        assert sum(len(r.token_ids) for r in survivor) == 20
        assert sum(len(r.token_ids) for r in generate_call(stub, 5)) == 5


def generate_call(stub, max_tokens: int):
    stop = inference_pb2.StopConditions(max_tokens=max_tokens)
    return stub.Generate(inference_pb2.GenerateRequest(prompt="hi", stop=stop), timeout=10)


def test_a_tiny_run_counts_every_token_through_the_relay_and_the_roofline(tmp_path):
    args = ("--case", "2:8", "--seconds", "0.3", "--step-ms", "10", "--rounds", "1")
    result, stdout = run_bench("relay", *args, "--client-procs", "2", cache=tmp_path)
    (run,) = result["cases"]["2:8"]
    (top,) = result["roofline"]["8"]
    for measured in (run, top):
        assert measured["failed"] == 0 and measured["first_error"] is None
        assert measured["tokens"] == 8 * 30  # every stream got all its tokens
        assert measured["tokens_per_s"] > 0 and measured["cpu_s"] >= 0
        assert math.isfinite(measured["cpu_s_per_1k_tokens"])
        assert len(measured["load_before"]) == 3
    assert (run["relays"], top["relays"]) == (1, 0)
    assert run["vs_roofline"] == pytest.approx(run["tokens_per_s"] / top["tokens_per_s"])
    assert "relay x1      2:8 #1:" in stdout and "roofline     8 streams #1:" in stdout


def test_a_front_end_started_by_hand_is_measured_and_left_running(tmp_path):
    """What the harness does with a router: its workers register where they are told, the
    clients stream from the given address, and the given pid's CPU is the one measured."""
    front = start_controller(tmp_path / "front", "ext", 2)
    try:
        front.pki.ca.write(tmp_path / "ca")
        result, _ = run_bench(
            "relay",
            *("--case", "2:32", "--seconds", "0.5", "--step-ms", "10", "--rounds", "1"),
            *("--no-roofline", "--client-procs", "2", "--front", front.address),
            *("--pid", str(front.pid), "--registry", front.registry, "--deployment", "ext"),
            *("--ca-dir", str(tmp_path / "ca")),
            cache=tmp_path,
        )
        (run,) = result["cases"]["2:32"]
        assert (run["failed"], run["tokens"], run["relays"]) == (0, 32 * 50, 1)
        assert run["cpu_s"] > 0  # the front end's own process forwarded 1600 tokens
        assert result["roofline"] == {}
        assert front.proc.poll() is None, "the harness stopped a front end it did not start"
    finally:
        front.stop()


def test_two_separate_routers_carry_every_token_and_are_the_ones_measured(tmp_path):
    args = ("--case", "2:8", "--seconds", "0.3", "--step-ms", "10", "--rounds", "1")
    result, stdout = run_bench(
        "relay", *args, "--no-roofline", "--client-procs", "2", "--routers", "2", cache=tmp_path
    )
    (run,) = result["cases"]["2:8"]
    assert (run["failed"], run["first_error"], run["tokens"]) == (0, None, 8 * 30)
    assert run["relays"] == 2 and run["cpu_s"] > 0  # the two routers' own processes
    assert "router x2      2:8 #1:" in stdout


def test_clients_on_generate_many_get_every_token_in_fewer_messages(tmp_path):
    """`--many`: each client process's streams on one GenerateMany call through a router; the
    same tokens are counted, and a worker step's tokens for one client leave in one message."""
    args = ("--case", "2:8", "--seconds", "0.3", "--step-ms", "10", "--rounds", "1")
    result, stdout = run_bench(
        "relay",
        *args,
        "--no-roofline",
        "--client-procs",
        "2",
        "--routers",
        "1",
        "--many",
        cache=tmp_path,
    )
    (run,) = result["cases"]["2:8"]
    assert (run["failed"], run["first_error"], run["tokens"]) == (0, None, 8 * 30)
    assert run["messages"] < run["tokens"]  # 4 streams a call, their steps' tokens together
    assert "router x1      2:8 #1:" in stdout
