"""Properties over every mode and every capability a worker could report."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from intentserve.policy import (
    BackendIntent,
    BackendKind,
    BackendStatus,
    CacheKind,
    Capability,
    DeviceKind,
    KvCacheDtype,
    Mode,
    ModelFacts,
    PagedAttentionRequiredError,
    RealizedCache,
    SchedulerKind,
    WeightFormat,
    WeightFormatStatus,
    disable_paged_attention,
    paged_attention_config,
    resolve,
    verify_report,
)

devices = st.sampled_from(list(DeviceKind))
dtypes = st.frozensets(st.sampled_from(list(KvCacheDtype)))
backend_status = st.builds(
    BackendStatus,
    kind=st.sampled_from(list(BackendKind)),
    available=st.booleans(),
    reason=st.just("probe said no"),
    kv_cache_dtypes=dtypes,
)
capabilities = st.builds(
    Capability,
    device_kind=devices,
    model=st.builds(ModelFacts, architecture=st.just("m"), has_kv_cache=st.booleans()),
    backends=st.lists(backend_status, max_size=4).map(tuple),
    layer_devices=st.lists(devices, max_size=4).map(tuple),
    no_kv_cache=st.booleans(),
    weight_formats=st.lists(
        st.builds(
            WeightFormatStatus,
            st.sampled_from([WeightFormat.INT8, WeightFormat.INT4]),
            st.booleans(),
            st.text(max_size=10),
        ),
        max_size=2,
    ).map(tuple),
)
configs = st.none() | st.builds(
    paged_attention_config,
    st.sampled_from([Mode.AUTO, Mode.ON]),
    prefix_caching=st.sampled_from([Mode.AUTO, Mode.OFF]),
    backend=st.sampled_from(["auto", "flash", "torch"]),
    kv_cache_dtype=st.sampled_from(list(KvCacheDtype)),
)
auto_devices = st.frozensets(devices)


@given(configs, capabilities, auto_devices)
def test_on_never_disabled_and_accepted_off_never_enabled_and_accepted(config, cap, autos):
    resolution = resolve(config, cap, autos)
    paged = resolution.paged_attention
    if paged.mode is Mode.ON:
        assert paged.enabled or not resolution.accepted
    if paged.mode is Mode.OFF:
        assert not paged.enabled
        assert resolution.backend.kind is BackendKind.CONTIGUOUS
    if resolution.accepted and paged.enabled:
        assert resolution.backend.kind.is_paged
        assert cap.backend(resolution.backend.kind).available


NAMED_BACKENDS = {
    BackendIntent.FLASH: BackendKind.FLASH_PAGED,
    BackendIntent.TORCH: BackendKind.TORCH_PAGED,
}


@given(configs, capabilities, auto_devices)
def test_the_backend_built_can_store_the_kv_dtype_and_an_explicit_one_is_honoured(
    config, cap, autos
):
    resolution = resolve(config, cap, autos)
    if config is None or not resolution.accepted:
        return
    dtype, kind = config.kv_cache_dtype, resolution.backend.kind
    if kind.is_paged and dtype is not KvCacheDtype.AUTO:
        assert dtype in cap.backend(kind).kv_cache_dtypes
    named = NAMED_BACKENDS.get(config.backend)
    if named is not None:
        # An explicit backend is a requirement: accepted means it imports and stores the dtype.
        status = cap.backend(named)
        assert status.available
        assert dtype is KvCacheDtype.AUTO or dtype in status.kv_cache_dtypes
        assert kind in (named, BackendKind.CONTIGUOUS)


@given(configs, capabilities, auto_devices)
def test_a_worker_that_follows_its_resolution_is_verified(config, cap, autos):
    resolution = resolve(config, cap, autos)
    if not resolution.accepted:
        return
    if resolution.paged_attention.enabled:
        realized = RealizedCache(
            kind=CacheKind.PAGED,
            backend=resolution.backend.kind,
            prefix_caching=resolution.prefix_caching.enabled,
            scheduler=SchedulerKind.PAGED,
        )
    else:
        reasons = resolution.fallback_reasons
        for reason in reasons:  # the loader path: every fallback goes through the helper
            assert disable_paged_attention(config, reason) is None
        realized = RealizedCache(
            kind=CacheKind.CONTIGUOUS, scheduler=SchedulerKind.DEFAULT, fallback_reasons=reasons
        )
    assert verify_report(config, realized) is None


@given(configs, st.booleans(), capabilities)
def test_the_opposite_of_the_policy_is_never_verified(config, realized_paged, cap):
    realized = RealizedCache(
        kind=CacheKind.PAGED if realized_paged else CacheKind.CONTIGUOUS,
        scheduler=SchedulerKind.PAGED if realized_paged else SchedulerKind.DEFAULT,
        backend=BackendKind.TORCH_PAGED if realized_paged else BackendKind.CONTIGUOUS,
    )
    required = config is not None and config.required
    if (required and not realized_paged) or (config is None and realized_paged):
        assert verify_report(config, realized) is not None
    if required:
        # Whatever reason a loader finds, a required config is never silently dropped.
        with pytest.raises(PagedAttentionRequiredError):
            disable_paged_attention(config, resolve(config, cap).paged_attention.reason)
