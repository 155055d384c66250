"""The launcher on an embedded Ray cluster, with a stand-in worker class named by its import path:
actors start, die, are restarted within their budget, and nothing outlives `shutdown()`."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from intentserve.controller.launch import launcher as launcher_module
from intentserve.controller.launch.launcher import (
    ActorState,
    LaunchError,
    RayLauncher,
    Replica,
    summary,
)

from tests.launcher.processes import processes_mentioning, short_temp_dir

FAKE = "tests.launcher.fake_worker:FakeWorker"


def replica(worker_id: str, max_restarts: int = 1, fingerprint: str = "a") -> Replica:
    return Replica(worker_id, {"worker_id": worker_id}, 0.1, 0, max_restarts, fingerprint)


def probe_until(launcher: RayLauncher, worker_id: str, done, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        probe = launcher.probe(0.5)[worker_id]
        if done(probe):
            return probe
        if time.monotonic() > deadline:
            pytest.fail(f"{worker_id}: still {probe} after {timeout_s} s")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def ray_session():
    temp_dir = short_temp_dir()
    launcher = RayLauncher(deployment="f", worker_class=FAKE, num_cpus=1, temp_dir=temp_dir)
    assert launcher.start(0.5, 0) == "embedded Ray cluster (1 CPUs)"
    yield launcher, temp_dir
    launcher.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.integration
def test_a_killed_actor_is_restarted_until_its_budget_is_spent(ray_session):
    launcher, _ = ray_session
    launcher.launch([replica("f-0", max_restarts=1)])
    first = probe_until(launcher, "f-0", lambda p: p.state is ActorState.RUNNING)
    assert first.status["worker_id"] == "f-0"
    launcher.kill("f-0", restart=True)
    second = probe_until(
        launcher,
        "f-0",
        lambda p: p.state is ActorState.RUNNING and p.status["pid"] != first.status["pid"],
    )
    assert second.status["worker_id"] == "f-0"  # constructed again with the same config
    launcher.kill("f-0", restart=True)  # its one restart is spent
    dead = probe_until(launcher, "f-0", lambda p: p.state is ActorState.DEAD)
    assert dead.error


@pytest.mark.integration
def test_actors_run_at_the_priority_of_the_process_that_started_the_cluster(ray_session):
    # Ray lowers its worker processes' priority by default (niceness 15): a worker's engine
    # would then yield its cores to the controller and clients of the requests it serves.
    launcher, _ = ray_session
    launcher.launch([replica("f-nice")])
    probe = probe_until(launcher, "f-nice", lambda p: p.state is ActorState.RUNNING)
    assert probe.status["niceness"] == os.getpriority(os.PRIO_PROCESS, 0)


@pytest.mark.integration
def test_a_class_that_cannot_be_imported_leaves_a_dead_actor_with_the_reason(ray_session):
    broken = RayLauncher(deployment="f", worker_class="tests.launcher.fake_worker:Missing")
    broken.launch([replica("f-missing", max_restarts=0)])
    dead = probe_until(broken, "f-missing", lambda p: p.state is ActorState.DEAD)
    assert "AttributeError" in dead.error and "Missing" in dead.error


@pytest.mark.integration
def test_a_live_actor_of_the_deployment_is_adopted_by_name_not_created_again(ray_session):
    launcher, _ = ray_session
    assert launcher.launch([replica("f-kept")]) == ()
    first = probe_until(launcher, "f-kept", lambda p: p.state is ActorState.RUNNING)
    # What the next `up` of the deployment does: the same names, in the same namespace.
    again = RayLauncher(deployment="f", worker_class=FAKE)
    assert again.launch([replica("f-kept"), replica("f-new")]) == ("f-kept",)
    kept = probe_until(again, "f-kept", lambda p: p.state is ActorState.RUNNING)
    assert kept.status["pid"] == first.status["pid"]
    # Another deployment's namespace holds no actor of that name: it creates its own.
    assert RayLauncher(deployment="g", worker_class=FAKE).launch([replica("f-kept")]) == ()


@pytest.mark.integration
def test_a_live_actor_started_from_other_settings_is_replaced_not_adopted(ray_session):
    launcher, _ = ray_session
    launcher.launch([replica("f-changed", fingerprint="a")])
    first = probe_until(launcher, "f-changed", lambda p: p.state is ActorState.RUNNING)
    again = RayLauncher(deployment="f", worker_class=FAKE)
    assert again.launch([replica("f-changed", fingerprint="b")]) == ()
    new = probe_until(again, "f-changed", lambda p: p.state is ActorState.RUNNING)
    assert new.status["pid"] != first.status["pid"]
    assert probe_until(launcher, "f-changed", lambda p: p.state is ActorState.DEAD)


@pytest.mark.integration
def test_shutdown_leaves_no_ray_process(ray_session):
    launcher, temp_dir = ray_session
    assert processes_mentioning(temp_dir)  # the cluster's processes name their temp dir
    launcher.shutdown()
    deadline = time.monotonic() + 15
    while processes_mentioning(temp_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(temp_dir) == []


def test_an_embedded_cluster_too_small_for_the_workers_is_refused():
    with pytest.raises(LaunchError, match="need 4 CPUs .* has 2"):
        RayLauncher._check_fits({"CPU": 4.0, "GPU": 0.0}, {"CPU": 2.0})
    RayLauncher._check_fits({"CPU": 2.0, "GPU": 0.0}, {"CPU": 2.0})


def test_a_ray_error_is_summarized_by_the_exception_that_ended_it():
    error = RuntimeError(
        "The actor died because of an error raised in its creation task, ray::x (pid=1)\n"
        "  File 'a.py', line 3, in <module>\n"
        "ModuleNotFoundError: No module named 'nope'"
    )
    assert summary(error) == (
        "The actor died because of an error raised in its creation task: "
        "ModuleNotFoundError: No module named 'nope'"
    )
    assert summary(RuntimeError("one line")) == "one line"


class _FlakyRay:
    """ray.init that fails `failures` times with `message`, then starts (no real cluster)."""

    def __init__(self, failures: int, message: str) -> None:
        self.failures, self.message = failures, message
        self.inits = self.shutdowns = 0

    def init(self, **options):
        self.inits += 1
        if self.inits <= self.failures:
            raise Exception(self.message)

    def shutdown(self):
        self.shutdowns += 1


SLOW_NODE = (
    "The current node timed out during startup. This could happen because some of the raylet "
    "failed to startup or the GCS has become overloaded."
)


LATE_GCS = "Timed out waiting for file /tmp/ray/session_x/gcs_server_port_abc. "


@pytest.mark.parametrize(
    "message",
    [SLOW_NODE, LATE_GCS],  # a late raylet; a GCS late to publish its port (a loaded machine)
    ids=["raylet", "gcs"],
)
def test_an_embedded_node_late_at_startup_is_started_once_more(monkeypatch, caplog, message):
    flaky = _FlakyRay(1, message)
    monkeypatch.setattr(launcher_module.ray, "init", flaky.init)
    monkeypatch.setattr(launcher_module.ray, "shutdown", flaky.shutdown)
    monkeypatch.setattr(launcher_module.ray, "cluster_resources", lambda: {"CPU": 2.0})
    assert RayLauncher(deployment="f", num_cpus=1).start(1, 0) == "embedded Ray cluster (2 CPUs)"
    assert (flaky.inits, flaky.shutdowns) == (2, 1)
    assert "timed out during start-up; starting it again" in caplog.text


def test_an_embedded_start_waits_longer_for_the_gcs_unless_the_operator_says(monkeypatch):
    monkeypatch.setattr(launcher_module.ray, "init", lambda **options: None)
    monkeypatch.setattr(launcher_module.ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.delenv(launcher_module.GCS_PORT_WAIT_ENV, raising=False)
    RayLauncher(deployment="f", num_cpus=1).start(1, 0)
    assert os.environ[launcher_module.GCS_PORT_WAIT_ENV] == launcher_module.EMBEDDED_GCS_WAIT_S
    monkeypatch.setenv(launcher_module.GCS_PORT_WAIT_ENV, "7")
    RayLauncher(deployment="f", num_cpus=1).start(1, 0)
    assert os.environ[launcher_module.GCS_PORT_WAIT_ENV] == "7"


def test_a_second_late_start_or_another_error_is_a_launch_error(monkeypatch):
    monkeypatch.setattr(launcher_module.ray, "shutdown", lambda: None)
    flaky = _FlakyRay(2, SLOW_NODE)
    monkeypatch.setattr(launcher_module.ray, "init", flaky.init)
    monkeypatch.setattr(launcher_module.ray, "shutdown", flaky.shutdown)
    with pytest.raises(LaunchError, match="cannot start an embedded Ray cluster: .*timed out"):
        RayLauncher(deployment="f", num_cpus=1).start(1, 0)
    assert flaky.inits == 2  # one retry only
    assert flaky.shutdowns == 2  # the half-started node is cleaned up both times
    other = _FlakyRay(1, "something else broke")
    monkeypatch.setattr(launcher_module.ray, "init", other.init)
    with pytest.raises(LaunchError, match="something else broke"):
        RayLauncher(deployment="f", num_cpus=1).start(1, 0)
    assert other.inits == 1
    joined = _FlakyRay(1, SLOW_NODE)
    monkeypatch.setattr(launcher_module.ray, "init", joined.init)
    with pytest.raises(LaunchError, match="cannot join ray://head:10001"):
        RayLauncher(deployment="f", address="ray://head:10001").start(1, 0)
    assert joined.inits == 1  # a joined cluster is the operator's: not retried


def test_an_embedded_cluster_bigger_than_the_host_is_refused_before_ray_starts(monkeypatch):
    """Found trying it: numCpus 1000 made an embedded cluster of 2000 "CPUs" on a 2-core host
    and each worker ran 1000 torch threads, READY as if nothing were wrong."""
    started = _FlakyRay(0, "")
    monkeypatch.setattr(launcher_module.ray, "init", started.init)
    monkeypatch.setattr(launcher_module.ray, "cluster_resources", lambda: {"CPU": 2000.0})
    monkeypatch.setattr(launcher_module.os, "sched_getaffinity", lambda pid: {0, 1})
    with pytest.raises(LaunchError) as error:
        RayLauncher(deployment="f").start(2000, 0)
    assert str(error.value) == (
        "the workers need 2000 CPUs in all (replicas x spec.resources.numCpus) but this host "
        "has 2 for an embedded Ray cluster: lower them, join a cluster (--ray-address), or size "
        "the embedded one anyway (--ray-num-cpus)"
    )
    assert started.inits == 0
    assert (
        RayLauncher(deployment="f").start(2, 0) == "embedded Ray cluster (2000 CPUs)"
    )  # fits: goes on
    assert RayLauncher(deployment="f", num_cpus=2000).start(
        2000, 0
    )  # the operator sized it: goes on
    assert started.inits == 2
