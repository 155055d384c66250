"""n > 1 in the schedulers: the first sequence computes its prompt less the last token; those
that fork from it then share that KV and compute the last token each, in one step together."""

from __future__ import annotations

from intentserve.worker.sched.sequence import FinishReason, SequenceStatus


def _fork(scheduler, new_seq, num_prompt_tokens: int, n: int, max_tokens: int = 4):
    parent = new_seq("p", num_prompt_tokens, max_tokens=max_tokens)
    scheduler.add(parent)
    children = [parent.fork(f"p-{i}", None) for i in range(1, n)]
    for child in children:
        scheduler.add(child)
    return parent, children


def test_forks_share_the_prompt_computed_once(paged, new_seq, step, drain):
    scheduler = paged(num_blocks=11, max_num_batched_tokens=256, enable_prefix_caching=False)
    parent, children = _fork(scheduler, new_seq, 37, 4)
    output, _ = step(scheduler)
    ((item,),) = [output.scheduled]
    assert (item.seq_id, item.num_new_tokens, item.needs_logits) == ("p", 36, False)
    assert all(c.status is SequenceStatus.WAITING for c in children)
    output, _ = step(scheduler)
    assert [(i.seq_id, i.start_pos, i.num_new_tokens) for i in output.scheduled] == [
        (s.seq_id, 36, 1) for s in (parent, *children)
    ]
    assert all(i.needs_logits for i in output.scheduled)
    # The two full blocks once; the part-filled third copied for each fork before it writes.
    assert output.block_copies == tuple((parent.block_table[2], c.block_table[2]) for c in children)
    assert scheduler.stats().kv.num_used_blocks == 2 + 4
    assert all(c.block_table[:2] == parent.block_table[:2] for c in children)
    drain(scheduler)
    assert all(s.finish_reason is FinishReason.LENGTH for s in (parent, *children))
    assert scheduler.allocator.num_free_blocks == 11


def test_forks_of_a_parent_that_ended_first_compute_their_prompt(paged, new_seq, step, drain):
    scheduler = paged(num_blocks=11, max_num_batched_tokens=256, enable_prefix_caching=False)
    parent, (child,) = _fork(scheduler, new_seq, 37, 2)
    step(scheduler)
    scheduler.abort("p")
    output, _ = step(scheduler)
    ((item,),) = [output.scheduled]
    assert (item.seq_id, item.start_pos, item.num_new_tokens) == ("p-1", 0, 37)
    assert output.block_copies == ()
    drain(scheduler)
    assert child.finish_reason is FinishReason.LENGTH
    assert scheduler.allocator.num_free_blocks == 11


def test_forks_in_the_contiguous_cache_compute_their_prompt_in_their_slot(
    default, new_seq, step, drain, sampled_token
):
    scheduler = default(num_slots=4, max_num_batched_tokens=256)
    parent, children = _fork(scheduler, new_seq, 37, 3)
    output, _ = step(scheduler)
    assert [(i.seq_id, i.num_new_tokens) for i in output.scheduled] == [
        ("p", 36),
        ("p-1", 37),
        ("p-2", 37),
    ]
    drain(scheduler)
    for seq in (parent, *children):
        assert seq.output_token_ids == [sampled_token(seq.seq_id, 37 + i) for i in range(4)]
