import pytest
from intentserve.policy import (
    BackendKind,
    CacheKind,
    PagedAttentionRequiredError,
    PolicyViolationError,
    RealizedCache,
    Reason,
    ReasonCode,
    SchedulerKind,
    check_realized,
    disable_paged_attention,
    paged_attention_config,
    select_scheduler,
    verify_report,
)

MIXED = Reason(
    ReasonCode.DEVICE_MAP_MIXED,
    "the device map places layers on cpu and cuda; the paged KV cache must live on one device",
)
FELL_BACK = Reason(ReasonCode.AUTO_NOT_ENABLED_ON_DEVICE, "auto is cuda-only")


def paged(**fields) -> RealizedCache:
    base = dict(kind=CacheKind.PAGED, backend=BackendKind.TORCH_PAGED, block_size=16, num_blocks=11)
    return RealizedCache(**(base | fields))


def contiguous(*reasons: Reason, **fields) -> RealizedCache:
    return RealizedCache(kind=CacheKind.CONTIGUOUS, fallback_reasons=reasons, **fields)


def test_optional_config_is_cleared_and_the_reason_recorded():
    recorded: list[Reason] = []
    assert disable_paged_attention(paged_attention_config("auto"), MIXED, recorded.append) is None
    assert recorded == [MIXED]


def test_required_config_raises_naming_mode_and_reason():
    recorded: list[Reason] = []
    with pytest.raises(PagedAttentionRequiredError) as err:
        disable_paged_attention(paged_attention_config("on"), MIXED, recorded.append)
    assert str(err.value) == (
        "PagedAttention was explicitly requested (paged_attention: on), but the device map places "
        "layers on cpu and cuda; the paged KV cache must live on one device"
    )
    assert err.value.reason is MIXED
    assert recorded == []  # a refused fallback is not a fallback


def test_off_has_nothing_to_disable():
    recorded: list[Reason] = []
    assert disable_paged_attention(None, MIXED, recorded.append) is None
    assert recorded == []


@pytest.mark.parametrize(
    ("mode", "realized", "expected"),
    [
        ("on", paged(), SchedulerKind.PAGED),
        ("auto", paged(), SchedulerKind.PAGED),
        ("auto", contiguous(FELL_BACK), SchedulerKind.DEFAULT),
        ("off", contiguous(), SchedulerKind.DEFAULT),
        ("off", RealizedCache(kind=CacheKind.NONE), SchedulerKind.DEFAULT),
    ],
)
def test_scheduler_follows_the_realized_cache(mode, realized, expected):
    choice = select_scheduler(paged_attention_config(mode), realized)
    assert choice.kind is expected
    if expected is SchedulerKind.DEFAULT:
        assert choice.reason is not None  # the default scheduler always says why it runs


def test_default_scheduler_reports_the_fallback_reason():
    choice = select_scheduler(paged_attention_config("auto"), contiguous(FELL_BACK))
    assert choice.reason is FELL_BACK


@pytest.mark.parametrize(
    ("mode", "options", "realized", "code"),
    [
        ("on", {}, contiguous(MIXED), ReasonCode.PAGED_REQUIRED_NOT_REALIZED),
        ("on", {}, RealizedCache(kind=CacheKind.NONE), ReasonCode.PAGED_REQUIRED_NOT_REALIZED),
        ("off", {}, paged(), ReasonCode.PAGED_REALIZED_WHILE_OFF),
        ("auto", {}, contiguous(), ReasonCode.FALLBACK_WITHOUT_REASON),
        ("on", {"prefix_caching": "on"}, paged(), ReasonCode.PREFIX_CACHING_NOT_REALIZED),
        (
            "on",
            {"prefix_caching": "off"},
            paged(prefix_caching=True),
            ReasonCode.PREFIX_CACHING_REALIZED_WHILE_OFF,
        ),
        ("on", {"backend": "flash"}, paged(), ReasonCode.BACKEND_MISMATCH),
        (
            "auto",
            {"backend": "torch"},
            paged(backend=BackendKind.FLASH_PAGED),
            ReasonCode.BACKEND_MISMATCH,
        ),
    ],
)
def test_violations_are_refused(mode, options, realized, code):
    requested = paged_attention_config(mode, **options)
    assert check_realized(requested, realized).code is code
    with pytest.raises(PolicyViolationError) as err:
        select_scheduler(requested, realized)
    assert err.value.reason.code is code


def test_required_without_realized_cache_message():
    with pytest.raises(PolicyViolationError, match="paged_attention: on requires a paged KV cache"):
        select_scheduler(paged_attention_config("on"), contiguous(MIXED))


@pytest.mark.parametrize(
    ("realized", "code"),
    [
        (paged(scheduler=SchedulerKind.PAGED), None),
        (paged(scheduler=SchedulerKind.DEFAULT), ReasonCode.SCHEDULER_MISMATCH),
        (paged(), ReasonCode.SCHEDULER_MISMATCH),  # never selected one
        (contiguous(FELL_BACK, scheduler=SchedulerKind.DEFAULT), None),
        (contiguous(FELL_BACK, scheduler=SchedulerKind.PAGED), ReasonCode.SCHEDULER_MISMATCH),
    ],
)
def test_controller_repeats_the_guard_including_the_scheduler(realized, code):
    reason = verify_report(paged_attention_config("auto"), realized)
    assert (reason.code if reason else None) is code
