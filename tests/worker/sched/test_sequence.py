"""Sequence: token bookkeeping across the prompt/output boundary."""

from __future__ import annotations

from intentserve.worker.sched.sequence import Sequence, SequenceStatus


def test_token_ids_span_prompt_and_outputs():
    seq = Sequence("a", [1, 2, 3], max_tokens=5)
    seq.output_token_ids.extend([4, 5])
    assert seq.get_token_ids(0, 3) == [1, 2, 3]
    assert seq.get_token_ids(1, 4) == [2, 3, 4]
    assert seq.get_token_ids(3, 5) == [4, 5]
    assert (seq.num_prompt_tokens, seq.num_output_tokens, seq.num_tokens) == (3, 2, 5)


def test_a_new_sequence_waits_with_nothing_computed():
    seq = Sequence("a", [1, 2, 3], max_tokens=5)
    assert seq.status is SequenceStatus.WAITING
    assert (seq.num_computed_tokens, seq.num_uncomputed_tokens) == (0, 3)
    assert seq.block_table == [] and seq.slot is None
    assert seq.params is None and not seq.is_finished


def test_arrival_index_follows_creation_order():
    first, second = Sequence("a", [1], max_tokens=1), Sequence("b", [1], max_tokens=1)
    assert first.arrival_index < second.arrival_index
