"""policy values survive the trip through protobuf unchanged, and bad messages name the field."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from intentserve import convert
from intentserve.policy import (
    BackendKind,
    CacheKind,
    KvBudget,
    Mode,
    RealizedCache,
    Reason,
    ReasonCode,
    ReasoningFormat,
    SchedulerKind,
    WeightFormat,
    examples,
    paged_attention_config,
    resolve,
)
from intentserve.v1 import common_pb2 as pb

from tests.policy.test_properties import capabilities, configs

reasons = st.builds(Reason, st.sampled_from(list(ReasonCode)), st.text(max_size=20))
realized = st.builds(
    RealizedCache,
    kind=st.sampled_from(list(CacheKind)),
    backend=st.sampled_from(list(BackendKind)),
    prefix_caching=st.booleans(),
    block_size=st.integers(0, 1024),
    num_blocks=st.integers(0, 1 << 20),
    kv_cache_bytes=st.integers(0, 1 << 40),
    max_num_seqs=st.integers(0, 4096),
    kv_cache_dtype=st.sampled_from(["", "float32", "bfloat16"]),
    scheduler=st.sampled_from([None, *SchedulerKind]),
    fallback_reasons=st.lists(reasons, max_size=3).map(tuple),
    dtype=st.sampled_from(["", "float32", "bfloat16"]),
    max_model_len=st.integers(0, 1 << 20),
    weight_format=st.sampled_from([f for f in WeightFormat if f is not WeightFormat.AUTO]),
    weight_bytes=st.integers(0, 1 << 40),
    sliding_window=st.integers(0, 1 << 20),
    num_windowed_layers=st.integers(0, 256),
    stream_interval=st.integers(0, 1 << 16),
    attention_kernel=st.text(max_size=40),
    decode_graphs=st.text(max_size=40),
    kernel_variant=st.sampled_from(["", "x86-64-v3", "avx512", "amx", "native"]),
    weights_held=st.text(max_size=60),
    reasoning=st.one_of(
        st.none(),
        st.builds(
            ReasoningFormat,
            start=st.text(min_size=1, max_size=12),
            end=st.text(min_size=1, max_size=12),
            opened_by_template=st.booleans(),
        ),
    ),
)


@given(configs)
def test_policy_round_trip(config):
    assert convert.policy_from_pb(convert.policy_to_pb(config)) == config


budgets = st.one_of(
    st.just(KvBudget()),
    st.builds(KvBudget, num_bytes=st.integers(1, 1 << 40)),
    st.builds(KvBudget, fraction=st.floats(0.001, 1.0)),
)


def test_policy_round_trip_with_options():
    config = paged_attention_config("on", block_size=32, backend="torch", kv_cache_dtype="float32")
    assert convert.policy_from_pb(convert.policy_to_pb(config)) == config


@given(budgets)
def test_kv_budget_round_trip(budget):
    assert convert.kv_budget_from_pb(convert.kv_budget_to_pb(budget)) == budget


@given(capabilities)
def test_capability_round_trip(cap):
    assert convert.capability_from_pb(convert.capability_to_pb(cap)) == cap


@given(realized)
def test_realized_round_trip(state):
    assert convert.realized_from_pb(convert.realized_to_pb(state)) == state


@given(configs, capabilities, budgets, st.sampled_from(list(WeightFormat)))
def test_resolution_round_trip(config, cap, budget, weights):
    resolution = resolve(config, cap, weights=weights)
    message = convert.resolution_to_pb(config, resolution, budget)
    got_config, got, got_budget = convert.resolution_from_pb(message)
    assert (got_config, got_budget) == (config, budget)
    assert got.decisions == resolution.decisions
    assert got.backend.kind is resolution.backend.kind
    assert got.fallback_reasons == resolution.fallback_reasons
    if resolution.accepted:  # a rejection is sent instead of a config
        assert got.weights == resolution.weights


def test_a_reasoning_format_must_name_both_markers():
    message = convert.realized_to_pb(RealizedCache(CacheKind.PAGED))
    message.reasoning.start = "<think>"  # the end marker left empty
    with pytest.raises(ValueError, match="realized.reasoning: .* start and end markers"):
        convert.realized_from_pb(message)


def test_a_resolved_config_must_name_a_resolved_weight_format():
    message = convert.resolution_to_pb(None, resolve(None, examples.cpu()), KvBudget())
    message.weight_format = pb.WEIGHT_FORMAT_AUTO
    with pytest.raises(ValueError, match="resolved_config.weight_format: auto is an intent"):
        convert.resolution_from_pb(message)


def test_a_peer_that_predates_the_weight_format_dequantizes():
    old = pb.RealizedState(cache_kind=pb.CACHE_KIND_NONE, backend=pb.BACKEND_KIND_CONTIGUOUS)
    assert convert.realized_from_pb(old).weight_format is WeightFormat.DEQUANTIZED
    message = convert.resolution_to_pb(None, resolve(None, examples.cpu()), KvBudget())
    message.ClearField("weight_format")
    message.ClearField("weight_intent")
    assert convert.resolution_from_pb(message)[1].weights.format is WeightFormat.DEQUANTIZED


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        (pb.PagedAttentionPolicy(), "policy.mode: MODE_UNSPECIFIED is not a valid value"),
        (
            pb.PagedAttentionPolicy(mode=pb.MODE_ON, block_size=5000),
            "block_size: must be between 1 and 1024",
        ),
    ],
)
def test_bad_policy_message_names_the_field(message, fragment):
    with pytest.raises(ValueError, match=fragment):
        convert.policy_from_pb(message)


def test_unknown_reason_code_is_refused():
    with pytest.raises(ValueError, match="reason.code: unknown reason code 'bogus'"):
        convert.reason_from_pb(pb.Reason(code="bogus", message="?"))


def test_unset_optional_fields_mean_the_defaults():
    assert convert.policy_from_pb(pb.PagedAttentionPolicy(mode=pb.MODE_ON)) == (
        paged_attention_config("on")
    )


def test_off_travels_as_mode_off():
    msg = convert.policy_to_pb(None)
    assert msg.mode == pb.MODE_OFF
    assert convert.policy_from_pb(msg) is None
    assert Mode.OFF.value == "off"
