"""Every row of the decision table: mode x device x situation -> outcome + reason."""

import pytest
from intentserve.policy import (
    BackendKind,
    DeviceKind,
    ReasonCode,
    decide_paged_attention,
    paged_attention_config,
    resolve,
)
from intentserve.policy.examples import BERT, backends, cpu, cuda, mixed

ENABLED, DISABLED, REJECTED = "enabled", "disabled", "rejected"

# (row id, capability, mode, config options, expected outcome, reason code, backend realized)
TABLE = [
    ("cpu-auto", cpu(), "auto", {}, DISABLED, ReasonCode.AUTO_NOT_ENABLED_ON_DEVICE, "contiguous"),
    ("cpu-on", cpu(), "on", {}, ENABLED, ReasonCode.ENABLED, "torch_paged"),
    ("cpu-off", cpu(), "off", {}, DISABLED, ReasonCode.MODE_OFF, "contiguous"),
    ("cuda-auto-flash", cuda(), "auto", {}, ENABLED, ReasonCode.ENABLED, "flash_paged"),
    ("cuda-on-flash", cuda(), "on", {}, ENABLED, ReasonCode.ENABLED, "flash_paged"),
    ("cuda-off", cuda(), "off", {}, DISABLED, ReasonCode.MODE_OFF, "contiguous"),
    (
        "cuda-auto-noflash",
        cuda(flash=False),
        "auto",
        {},
        ENABLED,
        ReasonCode.ENABLED,
        "triton_paged",
    ),
    ("cuda-on-noflash", cuda(flash=False), "on", {}, ENABLED, ReasonCode.ENABLED, "triton_paged"),
    (
        "cuda-auto-only-torch",
        cuda(backends=backends(flash=False, triton=False)),
        "auto",
        {},
        ENABLED,
        ReasonCode.ENABLED,
        "torch_paged",
    ),
    ("mixed-auto", mixed(), "auto", {}, DISABLED, ReasonCode.DEVICE_MAP_MIXED, "contiguous"),
    ("mixed-on", mixed(), "on", {}, REJECTED, ReasonCode.DEVICE_MAP_MIXED, "contiguous"),
    ("mixed-off", mixed(), "off", {}, DISABLED, ReasonCode.MODE_OFF, "contiguous"),
    (
        "no-backend-auto",
        cuda(backends=backends(flash=False, triton=False, torch_paged=False)),
        "auto",
        {},
        DISABLED,
        ReasonCode.BACKEND_UNAVAILABLE,
        "contiguous",
    ),
    (
        "no-backend-on",
        cuda(backends=backends(flash=False, triton=False, torch_paged=False)),
        "on",
        {},
        REJECTED,
        ReasonCode.BACKEND_UNAVAILABLE,
        "contiguous",
    ),
    (
        "bert-auto",
        cuda(model=BERT),
        "auto",
        {},
        DISABLED,
        ReasonCode.MODEL_HAS_NO_KV_CACHE,
        "contiguous",
    ),
    (
        "bert-on",
        cpu(model=BERT),
        "on",
        {},
        REJECTED,
        ReasonCode.MODEL_HAS_NO_KV_CACHE,
        "contiguous",
    ),
    (
        "nokv-auto",
        cuda(no_kv_cache=True),
        "auto",
        {},
        DISABLED,
        ReasonCode.KV_CACHE_DISABLED,
        "contiguous",
    ),
    (
        "nokv-on",
        cpu(no_kv_cache=True),
        "on",
        {},
        REJECTED,
        ReasonCode.KV_CACHE_DISABLED,
        "contiguous",
    ),
    (
        "fp8-on-cpu",
        cpu(),
        "on",
        {"kv_cache_dtype": "fp8_e4m3"},
        REJECTED,
        ReasonCode.KV_CACHE_DTYPE_UNSUPPORTED,
        "contiguous",
    ),
    (
        "fp32-auto-flash-cannot-store",
        cuda(),
        "auto",
        {"kv_cache_dtype": "float32"},  # flash cannot store fp32 but triton_paged can
        ENABLED,
        ReasonCode.ENABLED,
        "triton_paged",
    ),
    (
        "fp32-on-flash-cannot-store",
        cuda(),
        "on",
        {"kv_cache_dtype": "float32"},
        ENABLED,
        ReasonCode.ENABLED,
        "triton_paged",
    ),
    (
        "fp8-auto-only-triton-stores-it",
        cuda(),
        "auto",
        {"kv_cache_dtype": "fp8_e4m3"},
        ENABLED,
        ReasonCode.ENABLED,
        "triton_paged",
    ),
    (
        "fp32-off",  # off takes no kv_cache_dtype: no paged cache at all
        cuda(),
        "off",
        {},
        DISABLED,
        ReasonCode.MODE_OFF,
        "contiguous",
    ),
    (
        "bf16-auto-flash-stores",
        cuda(),
        "auto",
        {"kv_cache_dtype": "bfloat16"},
        ENABLED,
        ReasonCode.ENABLED,
        "flash_paged",
    ),
    (
        "fp32-flash-asked-on",
        cuda(),
        "on",
        {"backend": "flash", "kv_cache_dtype": "float32"},
        REJECTED,
        ReasonCode.KV_CACHE_DTYPE_UNSUPPORTED,
        "contiguous",
    ),
    (
        "fp32-flash-asked-auto",  # paging falls back, but the explicit backend rejects the worker
        cuda(),
        "auto",
        {"backend": "flash", "kv_cache_dtype": "float32"},
        DISABLED,
        ReasonCode.KV_CACHE_DTYPE_UNSUPPORTED,
        "contiguous",
    ),
    (
        "fp32-torch-asked-cuda",
        cuda(),
        "on",
        {"backend": "torch", "kv_cache_dtype": "float32"},
        ENABLED,
        ReasonCode.ENABLED,
        "torch_paged",
    ),
    (
        "flash-asked-cpu-on",
        cpu(),
        "on",
        {"backend": "flash"},
        REJECTED,
        ReasonCode.BACKEND_UNAVAILABLE,
        "contiguous",
    ),
    (
        "flash-asked-cuda-noflash-auto",
        cuda(flash=False),
        "auto",
        {"backend": "flash"},
        DISABLED,
        ReasonCode.BACKEND_UNAVAILABLE,
        "contiguous",
    ),
    (
        "torch-asked-cuda",
        cuda(),
        "on",
        {"backend": "torch"},
        ENABLED,
        ReasonCode.ENABLED,
        "torch_paged",
    ),
]


@pytest.mark.parametrize(
    ("capability", "mode", "options", "outcome", "code", "backend"),
    [row[1:] for row in TABLE],
    ids=[row[0] for row in TABLE],
)
def test_decision_table(capability, mode, options, outcome, code, backend):
    config = paged_attention_config(mode, **options)
    decision = decide_paged_attention(config, capability)
    assert decision.reason.code is code
    assert decision.enabled is (outcome == ENABLED)
    assert decision.accepted is (outcome != REJECTED)
    assert decision.required is (mode == "on")
    assert resolve(config, capability).backend.kind is BackendKind(backend)


UNAVAILABLE, DTYPE = ReasonCode.BACKEND_UNAVAILABLE, ReasonCode.KV_CACHE_DTYPE_UNSUPPORTED

# (row id, capability, mode, backend, kv_cache_dtype, rejection code or None, backend realized)
EXPLICIT_BACKEND = [
    ("flash-cpu-on", cpu(), "on", "flash", "auto", UNAVAILABLE, "contiguous"),
    ("flash-cpu-auto", cpu(), "auto", "flash", "auto", UNAVAILABLE, "contiguous"),
    ("flash-noflash-auto", cuda(flash=False), "auto", "flash", "auto", UNAVAILABLE, "contiguous"),
    ("flash-noflash-on", cuda(flash=False), "on", "flash", "auto", UNAVAILABLE, "contiguous"),
    ("flash-cuda-auto", cuda(), "auto", "flash", "auto", None, "flash_paged"),
    ("flash-cuda-bf16-on", cuda(), "on", "flash", "bfloat16", None, "flash_paged"),
    ("flash-cuda-fp32-on", cuda(), "on", "flash", "float32", DTYPE, "contiguous"),
    ("flash-cuda-fp32-auto", cuda(), "auto", "flash", "float32", DTYPE, "contiguous"),
    ("flash-cpu-fp32-auto", cpu(), "auto", "flash", "float32", UNAVAILABLE, "contiguous"),
    ("torch-cuda-auto", cuda(), "auto", "torch", "auto", None, "torch_paged"),
    ("torch-cuda-fp32-auto", cuda(), "auto", "torch", "float32", None, "torch_paged"),
    ("torch-cpu-auto", cpu(), "auto", "torch", "auto", None, "contiguous"),
    ("torch-cpu-on", cpu(), "on", "torch", "auto", None, "torch_paged"),
    ("torch-cpu-fp8-auto", cpu(), "auto", "torch", "fp8_e4m3", DTYPE, "contiguous"),
    ("torch-cuda-fp8-on", cuda(), "on", "torch", "fp8_e5m2", DTYPE, "contiguous"),
    ("triton-cpu-on", cpu(), "on", "triton", "auto", UNAVAILABLE, "contiguous"),
    ("triton-cuda-auto", cuda(), "auto", "triton", "auto", None, "triton_paged"),
    ("triton-cuda-fp8-on", cuda(), "on", "triton", "fp8_e4m3", None, "triton_paged"),
    ("triton-cuda-fp32-on", cuda(), "on", "triton", "float32", None, "triton_paged"),
]


@pytest.mark.parametrize(
    ("capability", "mode", "backend", "kv_cache_dtype", "code", "kind"),
    [row[1:] for row in EXPLICIT_BACKEND],
    ids=[row[0] for row in EXPLICIT_BACKEND],
)
def test_an_explicit_backend_is_a_requirement(
    capability, mode, backend, kv_cache_dtype, code, kind
):
    config = paged_attention_config(mode, backend=backend, kv_cache_dtype=kv_cache_dtype)
    resolution = resolve(config, capability)
    assert resolution.accepted is (code is None)
    assert resolution.backend.kind is BackendKind(kind)
    if code is not None:
        assert resolution.rejection.code is code
        assert resolution.backend.rejection.code is code
        assert f"attention_backend '{backend}' was requested" in resolution.rejection.message


def test_an_explicit_backend_that_cannot_store_the_kv_dtype_names_both():
    for mode in ("auto", "on"):
        config = paged_attention_config(mode, backend="flash", kv_cache_dtype="float32")
        assert resolve(config, cuda()).rejection.message == (
            "attention_backend 'flash' was requested, but flash_paged cannot store "
            "kv_cache_dtype float32 (it stores bfloat16, float16)"
        )


def test_auto_enabled_devices_setting_turns_auto_on_for_cpu():
    config = paged_attention_config("auto")
    devices = frozenset({DeviceKind.CPU, DeviceKind.CUDA})
    decision = decide_paged_attention(config, cpu(), auto_devices=devices)
    assert decision.enabled and not decision.required
    assert resolve(config, cpu(), devices).backend.kind is BackendKind.TORCH_PAGED


def test_reason_sentences_name_the_cause():
    on = paged_attention_config("on")
    assert decide_paged_attention(on, mixed()).reason.message == (
        "the device map places layers on cpu and cuda; the paged KV cache must live on one device"
    )
    no_backend = cuda(backends=backends(flash=False, triton=False, torch_paged=False))
    message = decide_paged_attention(on, no_backend).reason.message
    assert "flash_paged: No module named 'vllm_flash_attn'" in message
    assert "triton_paged: the Triton paged kernel needs a CUDA device" in message
    assert "torch_paged: torch was built without" in message
    auto_cpu = decide_paged_attention(paged_attention_config("auto"), cpu()).reason.message
    assert "'auto' enables it on cuda only and this worker is cpu" in auto_cpu
    fp8 = decide_paged_attention(paged_attention_config("on", kv_cache_dtype="fp8_e4m3"), cpu())
    assert "kv_cache_dtype 'fp8_e4m3' cannot be stored" in fp8.reason.message


def test_backend_fallback_is_recorded_with_the_import_error():
    resolution = resolve(paged_attention_config("auto"), cuda(flash=False))
    assert resolution.backend.kind is BackendKind.TRITON_PAGED
    (reason,) = [r for r in resolution.fallback_reasons if r.code is ReasonCode.BACKEND_FALLBACK]
    assert "No module named 'vllm_flash_attn'" in reason.message


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_backend_fallback_for_a_kv_dtype_names_the_skipped_backend(mode):
    resolution = resolve(paged_attention_config(mode, kv_cache_dtype="float32"), cuda())
    assert resolution.accepted and resolution.paged_attention.enabled
    assert resolution.backend.kind is BackendKind.TRITON_PAGED
    assert resolution.backend.reason.code is ReasonCode.BACKEND_FALLBACK
    assert resolution.backend.reason.message == (
        "using triton_paged because flash_paged cannot store kv_cache_dtype float32 "
        "(it stores bfloat16, float16)"
    )


def test_auto_names_every_faster_backend_it_skipped():
    only_torch = cuda(backends=backends(flash=False, triton=False))
    resolution = resolve(paged_attention_config("auto"), only_torch)
    assert resolution.backend.kind is BackendKind.TORCH_PAGED
    assert resolution.backend.reason.message == (
        "using torch_paged because flash_paged: No module named 'vllm_flash_attn'; "
        "triton_paged: the Triton paged kernel needs a CUDA device; this worker is cpu"
    )


@pytest.mark.parametrize(
    ("paged_mode", "prefix_mode", "capability", "enabled", "accepted", "code"),
    [
        ("on", "auto", cpu(), True, True, ReasonCode.ENABLED),
        ("on", "on", cpu(), True, True, ReasonCode.ENABLED),
        ("on", "off", cpu(), False, True, ReasonCode.MODE_OFF),
        ("auto", "auto", cpu(), False, True, ReasonCode.PAGED_CACHE_NOT_ENABLED),
        ("auto", "on", cpu(), False, False, ReasonCode.PAGED_CACHE_NOT_ENABLED),
        ("auto", "auto", cuda(), True, True, ReasonCode.ENABLED),
        ("off", "off", cuda(), False, True, ReasonCode.MODE_OFF),
    ],
)
def test_prefix_caching_rows(paged_mode, prefix_mode, capability, enabled, accepted, code):
    resolution = resolve(paged_attention_config(paged_mode, prefix_caching=prefix_mode), capability)
    decision = resolution.prefix_caching
    assert (decision.enabled, decision.accepted, decision.reason.code) == (enabled, accepted, code)
    assert resolution.accepted is (accepted and resolution.paged_attention.accepted)


def test_resolution_collects_rejection_and_fallbacks():
    rejected = resolve(paged_attention_config("on"), mixed())
    assert not rejected.accepted
    assert rejected.rejection.code is ReasonCode.DEVICE_MAP_MIXED
    fallback = resolve(paged_attention_config("auto"), cpu())
    assert fallback.accepted and fallback.rejection is None
    codes = [r.code for r in fallback.fallback_reasons]
    assert codes == [ReasonCode.AUTO_NOT_ENABLED_ON_DEVICE, ReasonCode.PAGED_CACHE_NOT_ENABLED]
    assert resolve(None, cpu()).fallback_reasons == ()
