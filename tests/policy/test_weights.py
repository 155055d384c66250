"""The weight format intent: resolution against the capability, refusal of what cannot be held,
the guard on what the worker reports, and the plausibility of that report."""

from dataclasses import replace

import pytest
from intentserve.policy import (
    AUTO_WEIGHT_FORMAT,
    CacheKind,
    IntentError,
    KvBudget,
    RealizedCache,
    ReasonCode,
    SchedulerKind,
    WeightFormat,
    WeightFormatStatus,
    check_plausible,
    check_weight_format,
    choose_weight_format,
    resolve,
)
from intentserve.policy.examples import cpu, cuda

QUANTIZED_CPU = cpu(
    weight_formats=(
        WeightFormatStatus(WeightFormat.INT8, True),
        WeightFormatStatus(WeightFormat.INT4, True),
        WeightFormatStatus(WeightFormat.W8A8, True),
        WeightFormatStatus(WeightFormat.NATIVE, True),
    )
)
NO_INT4_CPU = cpu(
    weight_formats=(
        WeightFormatStatus(WeightFormat.INT8, True),
        WeightFormatStatus(
            WeightFormat.INT4, False, "torch 2.1 has no _weight_int4pack_mm_for_cpu"
        ),
    )
)
CUDA = cuda(
    weight_formats=(
        WeightFormatStatus(WeightFormat.INT8, False, "int8 weights are implemented on CPU only"),
        WeightFormatStatus(WeightFormat.INT4, False, "int4 weights are implemented on CPU only"),
        WeightFormatStatus(WeightFormat.W8A8, False, "w8a8 weights are implemented on CPU only"),
        WeightFormatStatus(WeightFormat.NATIVE, False, "native weights run on CPU kernels"),
    )
)


@pytest.mark.parametrize(
    ("intent", "capability", "chosen", "code", "rejected"),
    [
        (
            WeightFormat.AUTO,
            QUANTIZED_CPU,
            AUTO_WEIGHT_FORMAT,
            ReasonCode.WEIGHT_FORMAT_AUTO,
            False,
        ),
        (WeightFormat.AUTO, CUDA, AUTO_WEIGHT_FORMAT, ReasonCode.WEIGHT_FORMAT_AUTO, False),
        (WeightFormat.DEQUANTIZED, CUDA, WeightFormat.DEQUANTIZED, ReasonCode.ENABLED, False),
        (WeightFormat.DEQUANTIZED, cpu(), WeightFormat.DEQUANTIZED, ReasonCode.ENABLED, False),
        (WeightFormat.INT8, QUANTIZED_CPU, WeightFormat.INT8, ReasonCode.ENABLED, False),
        (WeightFormat.INT4, QUANTIZED_CPU, WeightFormat.INT4, ReasonCode.ENABLED, False),
        (WeightFormat.W8A8, QUANTIZED_CPU, WeightFormat.W8A8, ReasonCode.ENABLED, False),
        (
            WeightFormat.W8A8,
            NO_INT4_CPU,
            WeightFormat.W8A8,
            ReasonCode.WEIGHT_FORMAT_UNAVAILABLE,
            True,
        ),
        (WeightFormat.W8A8, CUDA, WeightFormat.W8A8, ReasonCode.WEIGHT_FORMAT_UNAVAILABLE, True),
        (WeightFormat.INT8, NO_INT4_CPU, WeightFormat.INT8, ReasonCode.ENABLED, False),
        (
            WeightFormat.INT4,
            NO_INT4_CPU,
            WeightFormat.INT4,
            ReasonCode.WEIGHT_FORMAT_UNAVAILABLE,
            True,
        ),
        (WeightFormat.INT8, CUDA, WeightFormat.INT8, ReasonCode.WEIGHT_FORMAT_UNAVAILABLE, True),
        (WeightFormat.INT4, CUDA, WeightFormat.INT4, ReasonCode.WEIGHT_FORMAT_UNAVAILABLE, True),
        (WeightFormat.NATIVE, QUANTIZED_CPU, WeightFormat.NATIVE, ReasonCode.ENABLED, False),
        (
            WeightFormat.NATIVE,
            NO_INT4_CPU,  # a worker whose GGUF kernel could not be built reports none
            WeightFormat.NATIVE,
            ReasonCode.WEIGHT_FORMAT_UNAVAILABLE,
            True,
        ),
        (
            WeightFormat.NATIVE,
            CUDA,
            WeightFormat.NATIVE,
            ReasonCode.WEIGHT_FORMAT_UNAVAILABLE,
            True,
        ),
        # A worker that reports no formats predates the choice: it can only dequantize.
        (WeightFormat.INT8, cpu(), WeightFormat.INT8, ReasonCode.WEIGHT_FORMAT_UNAVAILABLE, True),
    ],
)
def test_weight_format_table(intent, capability, chosen, code, rejected):
    choice = choose_weight_format(intent, capability)
    assert choice.format is chosen and choice.format is not WeightFormat.AUTO
    assert choice.reason.code is code
    assert (choice.rejection is not None) is rejected


def test_an_unavailable_format_is_a_rejection_of_the_whole_resolution_naming_why():
    resolution = resolve(None, NO_INT4_CPU, weights=WeightFormat.INT4)
    assert not resolution.accepted
    assert resolution.rejection.code is ReasonCode.WEIGHT_FORMAT_UNAVAILABLE
    assert "'int4'" in resolution.rejection.message
    assert "_weight_int4pack_mm_for_cpu" in resolution.rejection.message
    assert resolve(None, QUANTIZED_CPU, weights=WeightFormat.INT4).accepted


def test_auto_says_what_it_chose_and_why():
    choice = resolve(None, QUANTIZED_CPU).weights
    assert choice.intent is WeightFormat.AUTO
    assert "dequantized" in choice.describe() and "bench/weights.py" in choice.reason.message


@pytest.mark.parametrize("word", ["fp8", "q4_1", "", "on"])
def test_a_bad_word_names_the_field_and_the_allowed_values(word):
    with pytest.raises(IntentError) as error:
        WeightFormat.parse(word, "spec.model.weights")
    assert "spec.model.weights" in str(error.value)
    assert "auto, dequantized, int8, int4, w8a8" in str(error.value)


@pytest.mark.parametrize(
    ("intent", "realized", "violation"),
    [
        (WeightFormat.INT4, WeightFormat.INT4, False),
        (WeightFormat.INT4, WeightFormat.DEQUANTIZED, True),
        (WeightFormat.INT8, WeightFormat.INT4, True),
        (WeightFormat.DEQUANTIZED, WeightFormat.INT8, True),
        (WeightFormat.AUTO, AUTO_WEIGHT_FORMAT, False),
        (WeightFormat.AUTO, WeightFormat.INT4, True),  # auto was resolved by the controller
    ],
)
def test_the_guard_compares_the_held_format_with_the_resolved_one(intent, realized, violation):
    choice = choose_weight_format(intent, QUANTIZED_CPU)
    reason = check_weight_format(choice, realized)
    assert (reason is not None) is violation
    if violation:
        assert reason.code is ReasonCode.WEIGHT_FORMAT_MISMATCH
        assert realized.value in reason.message


NONE = RealizedCache(kind=CacheKind.NONE, max_num_seqs=4, scheduler=SchedulerKind.DEFAULT)


def test_plausibility_knows_the_weight_format():
    assert (
        check_plausible(replace(NONE, weight_format=WeightFormat.INT4), QUANTIZED_CPU, KvBudget())
        is None
    )
    reason = check_plausible(
        replace(NONE, weight_format=WeightFormat.INT4), NO_INT4_CPU, KvBudget()
    )
    assert reason.code is ReasonCode.REALIZED_REPORT_IMPLAUSIBLE
    assert "int4" in reason.message and "unavailable" in reason.message
    too_big = replace(NONE, weight_bytes=QUANTIZED_CPU.total_memory_bytes + 1)
    assert check_plausible(too_big, QUANTIZED_CPU, KvBudget()).code is (
        ReasonCode.REALIZED_REPORT_IMPLAUSIBLE
    )
