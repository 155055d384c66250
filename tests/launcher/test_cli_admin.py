"""The admin CLI against a real controller on loopback with scripted workers: tables, `--json`,
streaming generate, drain, down, and the exit codes."""

from __future__ import annotations

import json

import pytest
from intentserve.controller.cli.main import main
from intentserve.controller.cli.render import generate_footer
from intentserve.controller.server import ControllerServer
from intentserve.controller.settings import ControllerSettings
from intentserve.policy.examples import BERT, cpu

from tests.controller.conftest import FAST, eventually
from tests.controller.scripted_worker import INVALID_DETAILS, Behaviour, ScriptedWorker


@pytest.fixture
def deployment():
    """A controller requiring PagedAttention, two honest CPU workers, READY."""
    server = ControllerServer(
        ControllerSettings(**FAST, paged_attention="on", replicas=2).config()
    ).start()
    workers = [ScriptedWorker(server.address, f"w-{i}", cpu(), num_tokens=3) for i in range(2)]
    for worker in workers:
        worker.up()
    assert server.wait_until_settled(5).ready
    yield server
    for worker in workers:
        worker.stop()
    server.stop(grace_s=0)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.integration
def test_status_prints_the_state_policy_and_worker_table(deployment, capsys):
    code, out, _ = run(capsys, "status", "--controller", deployment.address)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "deployment test-deployment: READY (2 of 2 required replicas verified)"
    assert lines[2].startswith("policy: paged_attention on (block_size 16")
    assert lines[3] == "weights: auto"
    header = next(line for line in lines if line.startswith("WORKER"))
    assert header.split()[:6] == ["WORKER", "STATE", "DEVICE", "ADDRESS", "CACHE", "BACKEND"]
    assert "WEIGHTS" in header.split()
    rows = [line.split() for line in lines if line.startswith("w-")]
    assert [r[:5] for r in rows] == [
        ["w-0", "ready", "cpu", deployment.deployment.workers()[0].address, "paged"],
        ["w-1", "ready", "cpu", deployment.deployment.workers()[1].address, "paged"],
    ]


@pytest.mark.integration
def test_status_json_has_each_workers_realized_cache(deployment, capsys):
    code, out, _ = run(capsys, "status", "--json", "--controller", deployment.address)
    assert code == 0
    status = json.loads(out)
    assert (status["state"], status["num_verified"], status["min_ready"]) == ("ready", 2, 2)
    assert status["policy"]["mode"] == "on"
    for worker in status["workers"]:
        realized = worker["realized"]
        assert (realized["cache_kind"], realized["scheduler"]) == ("paged", "paged")
        assert (realized["num_blocks"], realized["block_size"]) == (64, 16)
        assert realized["backend"] == "torch_paged"
        assert realized["weight_format"] == "dequantized"


@pytest.mark.integration
def test_workers_and_explain(deployment, capsys):
    code, out, _ = run(capsys, "workers", "--json", "--controller", deployment.address)
    assert code == 0
    assert [w["worker_id"] for w in json.loads(out)] == ["w-0", "w-1"]
    code, out, _ = run(capsys, "explain", "w-1", "--controller", deployment.address)
    assert code == 0
    assert [line.split(":")[0] for line in out.splitlines()][:2] == ["intent", "capability"]
    assert out.splitlines()[-1].startswith("deployment: READY")


@pytest.mark.integration
def test_generate_streams_the_text_and_reports_the_worker(deployment, capsys):
    code, out, err = run(
        capsys, "generate", "hello", "--max-tokens", "3", "--controller", deployment.address
    )
    assert code == 0
    assert out == "t0 t1 t2 \n"
    assert "3 tokens, finish length" in err
    code, out, _ = run(
        capsys, "generate", "hello", "--json", "--chat", "--controller", deployment.address
    )
    chunks = [json.loads(line) for line in out.splitlines()]
    assert "".join(c["text"] for c in chunks) == "t0 t1 t2 "  # chunks that wait may merge
    assert chunks[-1]["finish_reason"] == "length"


@pytest.mark.integration
def test_generate_n_prints_each_choice_whole_or_each_chunk_with_its_index(deployment, capsys):
    code, out, err = run(
        capsys, "generate", "hello", "--n", "2", "--controller", deployment.address
    )
    assert code == 0
    assert out == "[choice 0]\nt0 t1 t2 \n[choice 1]\nt0 t1 t2 \n\n"
    # the footer counts every choice's tokens, and each choice's as the text above reads
    assert "6 tokens in 2 choices (3 + 3), finish length" in err
    code, out, _ = run(
        capsys, "generate", "hello", "--n", "2", "--json", "--controller", deployment.address
    )
    chunks = [json.loads(line) for line in out.splitlines()]
    texts = {i: "".join(c["text"] for c in chunks if c["index"] == i) for i in (0, 1)}
    assert texts == {0: "t0 t1 t2 ", 1: "t0 t1 t2 "} and {c["index"] for c in chunks} == {0, 1}
    assert [c["finish_reason"] for c in chunks[-2:]] == ["length", "length"]


def test_the_generate_footer_counts_every_choice_and_names_each_finish_when_they_differ():
    def last(index: int, num_tokens: int, finish: str) -> dict:
        return {
            "worker_id": "w-0",
            "index": index,
            "num_output_tokens": num_tokens,
            "finish_reason": finish,
        }

    assert generate_footer([last(0, 3, "length")], 0.5) == "[w-0: 3 tokens, finish length, 0.50 s]"
    two = [last(0, 4, "length"), last(1, 2, "stop")]
    assert generate_footer(two, 1.0) == (
        "[w-0: 6 tokens in 2 choices (4 + 2), finish length / stop, 1.00 s]"
    )
    assert generate_footer([], 0.0) == "[?: 0 tokens, finish ?, 0.00 s]"


@pytest.mark.integration
def test_a_drain_below_min_ready_asks_for_force_and_resume_undoes_it(deployment, capsys):
    address = ("--controller", deployment.address)
    code, out, err = run(capsys, "drain", "w-1", *address)
    assert (code, out) == (1, "")
    assert err == (
        "error: FAILED_PRECONDITION: draining w-1 would leave 1 of 2 required replicas verified "
        "(min_ready 2): the deployment would stop serving until it is resumed\n"
        "use --force to drain it anyway\n"
    )
    assert deployment.verdict().ready
    code, out, _ = run(capsys, "drain", "w-1", "--force", *address)
    assert (code, out) == (0, "w-1: draining, 0 streams running\n")
    eventually(lambda: not deployment.verdict().ready, what="not ready")
    code, out, _ = run(capsys, "status", *address)
    lines = out.splitlines()
    assert lines[:2] == [
        "deployment test-deployment: PENDING (1 of 2 required replicas verified)",
        "reason: not_enough_replicas: 1 of 2 required replicas verified; not serving: "
        "w-1 (draining: receives no new requests)",
    ]
    assert [line.split()[:2] for line in lines if line.startswith("w-1 ")] == [["w-1", "draining"]]
    code, out, _ = run(capsys, "resume", "w-1", *address)
    assert (code, out) == (0, "w-1: ready\n")
    eventually(lambda: deployment.verdict().ready, what="READY again")
    code, out, _ = run(capsys, "resume", "w-1", "--json", *address)
    assert (code, json.loads(out)) == (0, {"state": "ready", "num_outstanding": 0})


@pytest.mark.integration
def test_drain_then_down(deployment, capsys):
    code, out, _ = run(capsys, "drain", "w-0", "--force", "--controller", deployment.address)
    assert (code, out) == (0, "w-0: draining, 0 streams running\n")
    code, out, _ = run(capsys, "down", "--controller", deployment.address)
    assert code == 0
    assert deployment.wait(5), "Admin.Shutdown did not reach the controller"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["explain", "nobody"], 2, "error: NOT_FOUND: unknown worker 'nobody'"),
        (["drain", "nobody"], 2, "error: NOT_FOUND"),
        (["resume", "nobody"], 2, "error: NOT_FOUND: unknown worker 'nobody'"),
        (
            ["generate", "hi", "--max-tokens", "-1"],
            2,
            "error: max_tokens: -1; allowed: an integer from 0 to 4294967295",
        ),
        (
            ["generate", "hi", "--top-k", "-2"],
            2,
            "error: top_k: -2; allowed: an integer from 0 to 4294967295",
        ),
        (
            ["generate", "hi", "--n", "-1"],
            2,
            "error: n: -1; allowed: an integer from 0 to 4294967295",
        ),
        (
            ["generate", "hi", "--seed", str(2**64)],
            2,
            f"error: seed: {2**64}; allowed: an integer from 0 to {2**64 - 1}",
        ),
    ],
)
def test_bad_input_exits_2_naming_it(deployment, capsys, argv, code, message):
    got, _, err = run(capsys, *argv, "--controller", deployment.address)
    assert got == code
    assert err.startswith(message)


@pytest.mark.integration
def test_a_request_the_engine_refuses_exits_2_naming_the_field(capsys):
    server = ControllerServer(ControllerSettings(**FAST, paged_attention="on").config()).start()
    worker = ScriptedWorker(server.address, "w-0", cpu(), behaviour=Behaviour.INVALID)
    try:
        worker.up()
        assert server.wait_until_settled(5).ready
        code, _, err = run(capsys, "generate", "hi", "--controller", server.address)
        assert (code, err.strip()) == (2, f"error: INVALID_ARGUMENT: {INVALID_DETAILS}")
    finally:
        worker.stop()
        server.stop(grace_s=0)


@pytest.mark.integration
def test_not_ready_is_exit_1_with_the_reason(capsys):
    server = ControllerServer(ControllerSettings(**FAST, paged_attention="on").config()).start()
    worker = ScriptedWorker(server.address, "enc-0", cpu(model=BERT))
    try:
        assert worker.register().WhichOneof("outcome") == "rejection"
        eventually(lambda: server.verdict().failed, what="the FAILED verdict")
        code, _, err = run(capsys, "generate", "hi", "--controller", server.address)
        assert code == 1
        assert "UNAVAILABLE: deployment is not ready: policy_violation" in err
        code, out, _ = run(capsys, "status", "--controller", server.address)
        assert code == 0
        assert "enc-0: model_has_no_kv_cache" in out
    finally:
        worker.stop()
        server.stop(grace_s=0)


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "hi", "--timeout", "-1"],
        ["generate", "hi", "--timeout", "nan"],
        ["status", "--rpc-timeout", "0"],
        ["drain", "w-0", "--rpc-timeout", "inf"],
    ],
)
def test_a_timeout_that_is_no_deadline_exits_2_naming_the_flag(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    flag, value = argv[-2:]
    assert f"argument {flag}: {value!r}; allowed: finite seconds > 0" in capsys.readouterr().err


def test_no_controller_is_exit_1(capsys):
    code, _, err = run(capsys, "status", "--controller", "127.0.0.1:1", "--rpc-timeout", "2")
    assert code == 1
    assert err.startswith("error: ")


class _Thinking:
    """A client whose one choice thinks, then answers (or, with n, each choice)."""

    def __init__(self, n: int = 1) -> None:
        self.n = n

    def generate(self, prompt, **_):
        for index in range(self.n):
            yield {"index": index, "text": "", "reasoning": f"hm{index} ", "finish_reason": ""}
            yield {"index": index, "text": f"yes{index}", "reasoning": "", "finish_reason": ""}
            yield {
                "index": index,
                "text": "",
                "reasoning": "",
                "finish_reason": "stop",
                "num_output_tokens": 3,
                "num_prompt_tokens": 2,
                "worker_id": "w0",
            }


@pytest.mark.parametrize("n", [1, 2])
def test_generate_prints_a_thinking_models_thinking_to_stderr_not_dropped(capsys, n):
    import argparse

    from intentserve.controller.cli import admin

    args = argparse.Namespace(
        prompt="q",
        chat=True,
        max_tokens=8,
        temperature=0.0,
        top_k=0,
        top_p=0.0,
        seed=None,
        stop=None,
        ignore_eos=False,
        n=n,
        timeout=None,
        json=False,
    )
    assert admin._generate(_Thinking(n), args) == 0
    out, err = capsys.readouterr()
    for i in range(n):
        assert f"yes{i}" in out and f"hm{i}" not in out
        assert f"thinking: hm{i} " in err
