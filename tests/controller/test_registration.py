"""Who may speak for a worker id, on a fake clock: a registration cannot take a live worker's
place, and a report or heartbeat counts only with the token of the current registration."""

import logging

import pytest
from intentserve.controller.control.registry import WorkerLoad
from intentserve.controller.control.state import HeartbeatAction, WorkerState
from intentserve.controller.errors import NotThisRegistration, WorkerAlive
from intentserve.policy import Reason, ReasonCode, examples

from tests.controller.scripted_worker import realized_for
from tests.controller.test_deployment import TIMEOUT_S, make, state_of

PEER = "ipv4:10.0.0.9:4242"
BROKE = Reason(ReasonCode.WORKER_NOT_SERVING, "suspect: its connection broke")


def register(deployment, token: bytes, address="w0:1", peer=PEER, proof=b""):
    return deployment.register("w0", address, examples.cpu(), token=token, proof=proof, peer=peer)


def verified(deployment, token: bytes) -> None:
    resolution = register(deployment, token)
    realized = realized_for(deployment.desired.policy, resolution)
    assert deployment.report_realized("w0", realized, None, token=token) is None


@pytest.mark.parametrize("state", ["loading", "ready", "draining"])
def test_a_live_workers_id_cannot_be_registered_again(state, caplog):
    deployment, clock, _ = make("on")
    caplog.set_level(logging.INFO, logger="intentserve.controller")
    if state == "loading":
        register(deployment, b"real")
    else:
        verified(deployment, b"real")
    if state == "draining":
        deployment.drain("w0", force=True)
    clock.now_s += TIMEOUT_S  # silent, but not past the timeout
    with pytest.raises(WorkerAlive, match=r"worker 'w0' is alive \(" + state):
        register(deployment, b"impostor", address="evil:1", peer="ipv4:10.6.6.6:1")
    record = deployment.registry.get("w0")
    assert (record.state.value, record.address, record.num_registrations) == (state, "w0:1", 1)
    logged = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert ("INFO", f"worker w0 registered from {PEER} (serves on w0:1; registration 1)") in logged
    refusals = [m for level, m in logged if level == "WARNING"]
    assert refusals and refusals[0].startswith("refused a registration of worker w0 from ipv4:10.6")


@pytest.mark.parametrize("state", ["loading", "ready"])
def test_a_live_worker_proving_its_current_registration_may_register_again(state):
    """Its own process asked twice to register (two heartbeats answered REGISTER while the first
    registration was in flight) is not taken for an impostor: it keeps its model."""
    deployment, clock, _ = make("on")
    if state == "loading":
        register(deployment, b"real")
    else:
        verified(deployment, b"real")
    with pytest.raises(WorkerAlive):
        register(deployment, b"impostor", proof=b"guessed")
    register(deployment, b"again", proof=b"real")
    record = deployment.registry.get("w0")
    assert (record.state, record.num_registrations) == (WorkerState.LOADING, 2)
    assert record.registration_token == b"again"
    with pytest.raises(WorkerAlive):  # the replaced registration's token proves nothing now
        register(deployment, b"third", proof=b"real")


@pytest.mark.parametrize("gone", ["silent", "lost", "suspect", "rejected"])
def test_a_worker_that_is_gone_may_be_replaced(gone):
    deployment, clock, _ = make("on")
    verified(deployment, b"old")
    if gone == "silent":  # heartbeats lapsed: the reconcile loop has not marked it yet
        clock.now_s += TIMEOUT_S * 1.5
    elif gone == "lost":
        clock.now_s += TIMEOUT_S * 1.5
        deployment.mark_lost(TIMEOUT_S)
    elif gone == "suspect":
        deployment.suspect("w0", "w0:1", BROKE)
    else:
        assert deployment.report_realized("w0", None, BROKE, token=b"old") == BROKE
    register(deployment, b"new", address="w0:2")
    record = deployment.registry.get("w0")
    assert (record.state, record.address, record.num_registrations) == (
        WorkerState.LOADING,
        "w0:2",
        2,
    )


def test_reports_and_heartbeats_count_only_with_the_current_registrations_token(caplog):
    deployment, clock, _ = make("on")
    verified(deployment, b"real")
    realized = deployment.registry.get("w0").realized
    implausible = realized.__class__(**{**vars(realized), "kv_cache_bytes": 1 << 40})
    with pytest.raises(NotThisRegistration, match="register again"):
        deployment.report_realized("w0", implausible, None, token=b"other", peer="ipv4:10.6.6.6:1")
    clock.now_s += 0.5
    load = WorkerLoad(num_running=9)
    assert deployment.heartbeat("w0", load, token=b"other") is HeartbeatAction.REGISTER
    record = deployment.registry.get("w0")
    assert (record.state, record.realized, record.load) == (
        WorkerState.READY,
        realized,
        WorkerLoad(),
    )
    assert record.last_seen_s == 100.0  # the other process's heartbeat is not the worker's
    assert deployment.heartbeat("w0", load, token=b"real") is HeartbeatAction.CONTINUE
    assert deployment.registry.get("w0").load == load
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings[0].startswith("refused a report for worker w0 from ipv4:10.6.6.6:1")
    assert warnings[1].startswith("ignored a heartbeat for worker w0 from in-process")
    assert state_of(deployment) is WorkerState.READY


def test_a_suspect_worker_heard_from_since_is_alive():
    """A broken stream alone does not free the id: once the worker heartbeats again, it is
    alive (a dead process cannot), and a registration under its id is refused."""
    deployment, clock, _ = make("on")
    verified(deployment, b"real")
    deployment.suspect("w0", "w0:1", BROKE)
    clock.now_s += 0.1
    assert deployment.heartbeat("w0", WorkerLoad(), token=b"real") is HeartbeatAction.CONTINUE
    with pytest.raises(WorkerAlive, match=r"worker 'w0' is alive \(suspect"):
        register(deployment, b"impostor", address="evil:1")
    assert deployment.registry.get("w0").address == "w0:1"
