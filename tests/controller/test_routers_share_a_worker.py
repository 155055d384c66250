"""Two routers in front of one worker with few slots: each router counts only its own requests,
so together they send the worker more than it takes. The worker enforces its own admission
(RESOURCE_EXHAUSTED past its slots), and a router takes that refusal as "keep the request
queued": it waits in the router's admission queue and is sent again once the worker has room,
so every request is served, none is refused to its client, and the worker never holds more than
its slots."""

from __future__ import annotations

import threading

import grpc
import pytest
from intentserve.controller.router.server import RouterServer
from intentserve.controller.router.settings import RouterConfig
from intentserve.controller.router.table import Readiness
from intentserve.controller.router.watched import EntryState, TableEntry, TableUpdate
from intentserve.policy import Reason, ReasonCode, examples

from tests.controller.conftest import DEPLOYMENT, Client, eventually
from tests.controller.scripted_worker import ScriptedWorker

pytestmark = pytest.mark.integration

NUM_SLOTS = 2
NUM_TOKENS = 10
NUM_REQUESTS_PER_ROUTER = 6


def test_two_routers_never_send_a_worker_more_than_its_slots_and_refuse_no_client():
    worker = ScriptedWorker(
        "127.0.0.1:9",
        "w0",
        examples.cpu(),
        num_tokens=NUM_TOKENS,
        token_delay_s=0.02,
        max_in_flight=NUM_SLOTS,
    )
    ready = Readiness(True, Reason(ReasonCode.READY, "fed by hand"))
    entry = TableEntry("w0", worker.address, EntryState.READY, NUM_SLOTS, 1)
    routers: list[RouterServer] = []
    clients: list[Client] = []
    try:
        for _ in range(2):
            config = RouterConfig(DEPLOYMENT, controller="nowhere:1", port=0)
            router = RouterServer(config, watch=False)
            routers.append(router.start())
            router.table.apply(TableUpdate(1, True, (entry,), (), ready, keepalive_s=60.0))
            clients.append(Client(router.address))
            eventually(clients[-1].serving, what="a router SERVING")
        tokens: list[int] = []
        errors: list[str] = []

        def run(client: Client) -> None:
            try:
                responses = list(client.generate(max_tokens=NUM_TOKENS, timeout=30))
                tokens.append(sum(len(r.token_ids) for r in responses))
            except grpc.RpcError as error:
                errors.append(f"{error.code().name}: {error.details()}")

        threads = [
            threading.Thread(target=run, args=(client,), daemon=True)
            for client in clients
            for _ in range(NUM_REQUESTS_PER_ROUTER)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert tokens == [NUM_TOKENS] * len(threads)
        assert worker.peak_in_flight == NUM_SLOTS
        assert worker.num_refused > 0  # the two routers together did send it more
    finally:
        for client in clients:
            client.channel.close()
        for router in routers:
            router.stop(grace_s=0)
        worker.stop()
