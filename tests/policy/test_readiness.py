import pytest
from intentserve.policy import (
    Availability,
    BackendKind,
    CacheKind,
    RealizedCache,
    Reason,
    ReasonCode,
    SchedulerKind,
    WorkerReport,
    paged_attention_config,
    readiness,
)

GOOD = RealizedCache(
    kind=CacheKind.PAGED,
    backend=BackendKind.TORCH_PAGED,
    block_size=16,
    num_blocks=64,
    scheduler=SchedulerKind.PAGED,
)
FALLBACK = RealizedCache(
    kind=CacheKind.CONTIGUOUS,
    scheduler=SchedulerKind.DEFAULT,
    fallback_reasons=(Reason(ReasonCode.AUTO_NOT_ENABLED_ON_DEVICE, "cpu"),),
)
REJECTED = Reason(ReasonCode.MODEL_HAS_NO_KV_CACHE, "the model (BertModel) has no KV cache")


def verdict(mode, reports, min_ready=2):
    return readiness(paged_attention_config(mode), reports, min_ready)


def test_ready_when_enough_replicas_conform():
    v = verdict("on", [WorkerReport("w0", GOOD), WorkerReport("w1", GOOD)])
    assert v.ready and not v.failed
    assert v.num_verified == 2 and v.reason.code is ReasonCode.READY
    assert v.worker_reasons == ()


def test_one_disagreeing_worker_among_several_blocks_readiness():
    reports = [WorkerReport(f"w{i}", GOOD) for i in range(3)] + [WorkerReport("w3", FALLBACK)]
    v = verdict("on", reports)
    assert not v.ready and v.failed
    assert v.num_verified == 3  # enough replicas, still not ready
    assert v.reason.code is ReasonCode.POLICY_VIOLATION
    assert v.reason.message.startswith("worker w3: paged_attention: on requires a paged KV cache")
    assert [w for w, _ in v.worker_reasons] == ["w3"]


def test_a_rejected_worker_fails_the_deployment_with_its_reason():
    v = verdict("on", [WorkerReport("w0", GOOD), WorkerReport("w1", rejection=REJECTED)], 1)
    assert not v.ready and v.failed
    assert dict(v.worker_reasons)["w1"] is REJECTED


IMPLAUSIBLE = Reason(
    ReasonCode.REALIZED_REPORT_IMPLAUSIBLE,
    "1099511627776 KV bytes reported, but the worker has 8589934592 bytes free",
)


@pytest.mark.parametrize(
    ("min_ready", "ready", "degraded", "code"),
    [(1, True, True, ReasonCode.DEGRADED), (2, False, False, ReasonCode.NOT_ENOUGH_REPLICAS)],
)
def test_a_report_that_cannot_be_true_is_a_fault_of_that_worker_not_a_policy_failure(
    min_ready, ready, degraded, code
):
    """It says nothing of the policy (the worker is broken, or not what it claims): it is out of
    service, as a dead one is, until it is replaced; the others serve while minReady holds."""
    reports = [WorkerReport("w0", GOOD), WorkerReport("w1", GOOD, rejection=IMPLAUSIBLE)]
    v = verdict("on", reports, min_ready)
    assert (v.ready, v.degraded, v.failed, v.reason.code) == (ready, degraded, False, code)
    assert v.num_verified == 1
    assert v.reason.message.endswith(f"; not serving: w1 ({IMPLAUSIBLE.message})")
    assert dict(v.worker_reasons)["w1"] is IMPLAUSIBLE


def test_off_violation_is_treated_like_on_failing():
    v = verdict("off", [WorkerReport("w0", GOOD)], 1)
    assert v.failed and not v.ready
    assert dict(v.worker_reasons)["w0"].code is ReasonCode.PAGED_REALIZED_WHILE_OFF


def test_auto_fallback_is_ready():
    assert verdict("auto", [WorkerReport("w0", FALLBACK), WorkerReport("w1", GOOD)]).ready


@pytest.mark.parametrize(
    ("reports", "code"),
    [
        ([WorkerReport("w0", GOOD), WorkerReport("w1")], ReasonCode.WORKER_PENDING),
        ([WorkerReport("w0", GOOD)], None),
    ],
)
def test_not_enough_verified_replicas(reports, code):
    v = verdict("on", reports)
    assert not v.ready and not v.failed and not v.degraded
    assert v.reason.code is ReasonCode.NOT_ENOUGH_REPLICAS
    assert v.reason.message == "1 of 2 required replicas verified"
    assert [r.code for _, r in v.worker_reasons] == ([code] if code else [])


DRAINING = Reason(ReasonCode.WORKER_NOT_SERVING, "draining: receives no new requests")
SUSPECT = Reason(ReasonCode.WORKER_NOT_SERVING, "suspect: its connection failed")
LOST = Reason(ReasonCode.WORKER_NOT_SERVING, "lost: no heartbeat for 5.2 s")


@pytest.mark.parametrize(
    ("availability", "why", "min_ready", "ready", "degraded", "code"),
    [
        # Every availability of a verified second worker, with min_ready 1 (still met) and 2.
        (Availability.SERVING, None, 1, True, False, ReasonCode.READY),
        (Availability.DRAINING, DRAINING, 1, True, False, ReasonCode.READY),
        (Availability.SUSPECT, SUSPECT, 1, True, True, ReasonCode.DEGRADED),
        (Availability.LOST, LOST, 1, True, True, ReasonCode.DEGRADED),
        (Availability.SERVING, None, 2, True, False, ReasonCode.READY),
        (Availability.DRAINING, DRAINING, 2, False, False, ReasonCode.NOT_ENOUGH_REPLICAS),
        (Availability.SUSPECT, SUSPECT, 2, False, False, ReasonCode.NOT_ENOUGH_REPLICAS),
        (Availability.LOST, LOST, 2, False, False, ReasonCode.NOT_ENOUGH_REPLICAS),
    ],
)
def test_a_worker_out_of_service_is_not_counted_and_says_why(
    availability, why, min_ready, ready, degraded, code
):
    reports = [
        WorkerReport("w0", GOOD),
        WorkerReport("w1", GOOD, availability=availability, why=why),
    ]
    v = verdict("on", reports, min_ready)
    assert (v.ready, v.degraded, v.failed, v.reason.code) == (ready, degraded, False, code)
    assert v.num_verified == (2 if availability is Availability.SERVING else 1)
    if why is not None:
        assert v.reason.message.endswith(f"; not serving: w1 ({why.message})")
        assert dict(v.worker_reasons)["w1"] == why


def test_a_worker_lost_before_it_reported_counts_as_lost():
    lost = WorkerReport("w1", availability=Availability.LOST, why=LOST)
    v = verdict("on", [WorkerReport("w0", GOOD), lost], 1)
    assert v.ready and v.degraded
    assert dict(v.worker_reasons)["w1"] == LOST


def test_min_ready_must_be_positive():
    with pytest.raises(ValueError, match="min_ready must be at least 1"):
        verdict("on", [], 0)
