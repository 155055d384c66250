"""Behaviour both schedulers share, run against each: budget, chunking, finishing, abort."""

from __future__ import annotations

import pytest
from intentserve.worker.sched.sequence import FinishReason, SequenceStatus


def test_a_long_prompt_is_prefilled_in_chunks_of_the_token_budget(
    make_scheduler, new_seq, step, sampled_token
):
    scheduler = make_scheduler(max_num_batched_tokens=16)
    scheduler.add(new_seq("a", 50, max_tokens=3))
    chunks = []
    for _ in range(4):
        output, _ = step(scheduler)
        (item,) = output.scheduled
        chunks.append((item.start_pos, item.num_new_tokens, item.needs_logits))
        assert list(item.token_ids) == list(range(item.start_pos, item.num_context_tokens))
    assert chunks == [(0, 16, False), (16, 16, False), (32, 16, False), (48, 2, True)]
    output, _ = step(scheduler)
    (item,) = output.scheduled
    assert (item.start_pos, item.token_ids, item.needs_logits) == (
        50,
        (sampled_token("a", 50),),
        True,
    )


def test_the_token_budget_and_max_num_seqs_hold_every_step(make_scheduler, new_seq, drain):
    scheduler = make_scheduler(max_num_seqs=3, max_num_batched_tokens=20)
    seqs = [new_seq(f"s{i}", 30, max_tokens=5, first=100 * i) for i in range(6)]
    for seq in seqs:
        scheduler.add(seq)
    outputs = drain(scheduler)
    assert all(0 < output.num_batched_tokens <= 20 for output in outputs)
    assert all(len(output.scheduled) <= 3 for output in outputs)
    assert all(seq.num_output_tokens == 5 for seq in seqs)
    assert all(seq.finish_reason is FinishReason.LENGTH for seq in seqs)


def test_decodes_of_running_sequences_come_before_admissions(make_scheduler, new_seq, step):
    scheduler = make_scheduler(max_num_batched_tokens=8)
    scheduler.add(new_seq("a", 8, max_tokens=10))
    step(scheduler)
    scheduler.add(new_seq("b", 20, max_tokens=10, first=100))
    output, _ = step(scheduler)
    assert [(item.seq_id, item.num_new_tokens) for item in output.scheduled] == [
        ("a", 1),
        ("b", 7),
    ]


def test_outputs_are_the_sampled_tokens_in_order(make_scheduler, new_seq, drain, sampled_token):
    scheduler = make_scheduler(max_num_batched_tokens=7)
    seq = new_seq("a", 12, max_tokens=4)
    scheduler.add(seq)
    drain(scheduler)
    assert seq.output_token_ids == [sampled_token("a", 12 + i) for i in range(4)]
    assert seq.status is SequenceStatus.FINISHED
    assert scheduler.stats().kv.num_used_blocks == 0


def test_finish_at_max_model_len(make_scheduler, new_seq, drain):
    scheduler = make_scheduler(max_model_len=24)
    seq = new_seq("a", 20, max_tokens=100)
    scheduler.add(seq)
    drain(scheduler)
    assert (seq.num_tokens, seq.finish_reason) == (24, FinishReason.LENGTH)


def test_finish_when_the_engine_says_the_sampled_token_stops(make_scheduler, new_seq):
    # Control flows down: the engine judges the token it sampled and tells postprocess.
    scheduler = make_scheduler()
    seq = new_seq("a", 10, max_tokens=5)
    scheduler.add(seq)
    first = scheduler.postprocess(scheduler.schedule(), {"a": 7})
    assert first == [] and seq.output_token_ids == [7]
    finished = scheduler.postprocess(scheduler.schedule(), {"a": 8}, {"a": FinishReason.STOP})
    assert finished == [seq]
    assert (seq.output_token_ids, seq.finish_reason) == ([7, 8], FinishReason.STOP)
    assert scheduler.num_unfinished == 0 and scheduler.stats().kv.num_used_blocks == 0


def test_postprocess_returns_the_finished_sequences(make_scheduler, new_seq, step):
    scheduler = make_scheduler()
    short, long = new_seq("short", 5, max_tokens=1), new_seq("long", 5, max_tokens=3, first=50)
    scheduler.add(short)
    scheduler.add(long)
    _, finished = step(scheduler)
    assert finished == [short]
    assert scheduler.num_unfinished == 1


def test_abort_frees_a_running_sequence_and_drops_a_waiting_one(make_scheduler, new_seq, step):
    scheduler = make_scheduler(max_num_seqs=1)
    running, waiting = new_seq("running", 20, max_tokens=9), new_seq("waiting", 5, first=50)
    scheduler.add(running)
    scheduler.add(waiting)
    step(scheduler)
    assert scheduler.stats().kv.num_used_blocks > 0
    assert scheduler.abort("running")
    assert scheduler.abort("waiting")
    assert not scheduler.abort("running")
    assert not scheduler.abort("unknown")
    for seq in (running, waiting):
        assert (seq.status, seq.finish_reason) == (SequenceStatus.FINISHED, FinishReason.ABORT)
    assert scheduler.num_unfinished == 0
    assert scheduler.stats().kv.num_used_blocks == 0
    assert scheduler.schedule().is_empty


def test_a_sequence_aborted_during_the_step_is_skipped_by_postprocess(make_scheduler, new_seq):
    scheduler = make_scheduler()
    seq = new_seq("a", 10)
    scheduler.add(seq)
    output = scheduler.schedule()
    scheduler.abort("a")
    assert scheduler.postprocess(output, {"a": 1}) == []
    assert seq.output_token_ids == []


def test_postprocess_of_a_stale_output_raises(make_scheduler, new_seq):
    scheduler = make_scheduler()
    scheduler.add(new_seq("a", 10))
    output = scheduler.schedule()
    scheduler.postprocess(output, {"a": 1})
    with pytest.raises(RuntimeError, match="stale output"):
        scheduler.postprocess(output, {"a": 1})


def test_a_missing_sampled_token_raises(make_scheduler, new_seq):
    scheduler = make_scheduler()
    scheduler.add(new_seq("a", 10))
    with pytest.raises(RuntimeError, match="no sampled token"):
        scheduler.postprocess(scheduler.schedule(), {})


def test_a_sequence_id_already_queued_is_rejected_at_add(make_scheduler, new_seq):
    # The request's own content (empty prompt, max_tokens, length) is the engine's to check.
    scheduler = make_scheduler()
    scheduler.add(new_seq("dup", 5))
    with pytest.raises(ValueError, match="already queued"):
        scheduler.add(new_seq("dup", 5))
    assert scheduler.num_unfinished == 1


def test_limits_below_one_are_rejected(make_scheduler):
    with pytest.raises(ValueError, match="max_num_batched_tokens must be at least 1, got 0"):
        make_scheduler(max_num_batched_tokens=0)
