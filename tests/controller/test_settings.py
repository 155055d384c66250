"""ControllerSettings: `INTENTSERVE_*` env vars, the desired state, errors that name the field."""

import re

import pytest
from intentserve.controller.router.admission import QueueLimits
from intentserve.controller.settings import (
    ControllerSettings,
    describe_errors,
    parse_devices,
)
from intentserve.policy import (
    BackendIntent,
    DeviceKind,
    KvBudget,
    KvCacheDtype,
    Mode,
    paged_attention_config,
)
from pydantic import ValidationError


@pytest.fixture(autouse=True)
def plaintext(monkeypatch):
    """These tests are about the intent and the timings; security has its own below."""
    monkeypatch.setenv("INTENTSERVE_INSECURE", "true")


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"INTENTSERVE_INSECURE": "false"}, "tls_cert_file: no TLS files are given"),
        ({"INTENTSERVE_TLS_CERT_FILE": "/x.crt"}, "go together"),
        ({"INTENTSERVE_HOST": "0.0.0.0"}, "insecure: the controller would bind 0.0.0.0"),
    ],
)
def test_security_is_a_default_and_plaintext_off_loopback_is_named(monkeypatch, env, fragment):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=re.escape(fragment)):
        ControllerSettings()


def test_plaintext_off_loopback_only_when_named(monkeypatch):
    monkeypatch.setenv("INTENTSERVE_HOST", "0.0.0.0")
    monkeypatch.setenv("INTENTSERVE_INSECURE_NETWORK", "true")
    config = ControllerSettings().config()
    assert config.host == "0.0.0.0" and config.security.insecure


def test_defaults_give_auto_on_cuda_and_one_replica():
    desired = ControllerSettings().desired_state()
    assert desired.policy == paged_attention_config("auto")
    assert desired.auto_devices == frozenset({DeviceKind.CUDA})
    assert (desired.replicas, desired.min_ready) == (1, 1)


def test_admission_follows_the_workers_unless_the_operator_sets_it(monkeypatch):
    config = ControllerSettings(insecure=True).config()
    assert config.max_outstanding_per_worker is None  # each worker's realized slots
    assert config.admission == QueueLimits(max_queued=None, max_wait_s=300.0)  # 4 x the slots
    for name, value in {
        "MAX_OUTSTANDING_PER_WORKER": "8",
        "MAX_QUEUED": "0",
        "MAX_QUEUE_WAIT_S": "2.5",
    }.items():
        monkeypatch.setenv(f"INTENTSERVE_{name}", value)
    config = ControllerSettings(insecure=True).config()
    assert config.max_outstanding_per_worker == 8
    assert config.admission == QueueLimits(max_queued=0, max_wait_s=2.5)


def test_env_vars_with_the_prefix_configure_everything(monkeypatch):
    for name, value in {
        "PORT": "0",
        "DEPLOYMENT": "chat",
        "PAGED_ATTENTION": "ON",
        "BLOCK_SIZE": "32",
        "KV_CACHE_FRACTION": "0.5",
        "PREFIX_CACHING": "off",
        "ATTENTION_BACKEND": "torch",
        "KV_CACHE_DTYPE": "bfloat16",
        "AUTO_ENABLED_DEVICES": "cuda, cpu",
        "REPLICAS": "3",
        "MIN_READY": "2",
        "HEARTBEAT_TIMEOUT_S": "2.5",
    }.items():
        monkeypatch.setenv(f"INTENTSERVE_{name}", value)
    settings = ControllerSettings()
    desired = settings.desired_state()
    assert settings.port == 0 and desired.deployment == "chat"
    assert desired.kv_budget == KvBudget(fraction=0.5)
    assert desired.policy == paged_attention_config(
        Mode.ON,
        block_size=32,
        prefix_caching=Mode.OFF,
        backend=BackendIntent.TORCH,
        kv_cache_dtype=KvCacheDtype.BFLOAT16,
    )
    assert desired.auto_devices == frozenset(DeviceKind)
    assert (desired.replicas, desired.min_ready) == (3, 2)
    assert settings.heartbeat_timeout_s == 2.5


def test_off_resolves_to_none_and_yaml_booleans_are_modes():
    assert ControllerSettings(paged_attention="off").desired_state().policy is None
    assert ControllerSettings(paged_attention=False).desired_state().policy is None
    assert ControllerSettings(paged_attention=True).paged_attention is Mode.ON


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"paged_attention": "maybe"}, "paged_attention: invalid value 'maybe'; allowed values"),
        ({"prefix_caching": "yes"}, "prefix_caching: invalid value 'yes'; allowed values"),
        ({"attention_backend": "xformers"}, "allowed values are auto, flash, torch"),
        ({"kv_cache_dtype": "int4"}, "kv_cache_dtype: invalid value 'int4'"),
        ({"weights": "fp8"}, "weights: invalid value 'fp8'; allowed values are auto, dequantized"),
        ({"auto_enabled_devices": "cuda,tpu"}, "invalid value 'tpu'; allowed values are cpu, cuda"),
        ({"block_size": 0}, "block_size"),
        ({"replicas": 0}, "replicas"),
        ({"heartbeat_timeout_s": 0.5}, "heartbeat_timeout_s (0.5) must be longer than"),
        ({"paged_attention": "off", "prefix_caching": "on"}, "prefix_caching: 'on' has no effect"),
        (
            {"paged_attention": "off", "attention_backend": "torch"},
            "backend: 'torch' has no effect",
        ),
        ({"kv_cache_bytes": 10, "kv_cache_fraction": 0.5}, "kv_cache_memory: give either bytes"),
        ({"max_outstanding_per_worker": 0}, "max_outstanding_per_worker"),
        ({"max_queued": -1}, "max_queued"),
        ({"max_queue_wait_s": 0}, "max_queue_wait_s"),
        ({"max_queue_wait_s": "inf"}, "max_queue_wait_s"),
    ],
)
def test_bad_values_name_the_field(overrides, fragment):
    with pytest.raises(ValidationError, match=re.escape(fragment)):
        ControllerSettings(**overrides)


def test_describe_errors_names_the_env_var():
    with pytest.raises(ValidationError) as error:
        ControllerSettings(paged_attention="maybe")
    assert describe_errors(error.value) == (
        "paged_attention (INTENTSERVE_PAGED_ATTENTION): invalid value 'maybe'; "
        "allowed values are auto, on, off"
    )


def test_empty_device_list_means_auto_enables_nowhere():
    assert parse_devices("") == frozenset()
    assert parse_devices(["CPU", DeviceKind.CUDA]) == frozenset(DeviceKind)
