"""DefaultScheduler: one max-length slot per running sequence, admission by free slot."""

from __future__ import annotations

from intentserve.worker.sched.sequence import SequenceStatus


def test_the_output_carries_slots(default, new_seq, step):
    scheduler = default(num_slots=2)
    scheduler.add(new_seq("a", 10))
    scheduler.add(new_seq("b", 10, first=100))
    output, _ = step(scheduler)
    assert [(item.seq_id, item.slot, item.block_table) for item in output.scheduled] == [
        ("a", 0, None),
        ("b", 1, None),
    ]


def test_a_freed_slot_is_reused_by_the_next_waiting_sequence(default, new_seq, step):
    scheduler = default(num_slots=2)
    short = new_seq("short", 10, max_tokens=1)
    long = new_seq("long", 10, max_tokens=5, first=100)
    waiting = new_seq("waiting", 10, first=200)
    for seq in (short, long, waiting):
        scheduler.add(seq)
    _, finished = step(scheduler)
    assert finished == [short]
    assert short.slot is None
    assert waiting.status is SequenceStatus.WAITING  # no free slot during the step
    output, _ = step(scheduler)
    assert {item.seq_id: item.slot for item in output.scheduled} == {"long": 1, "waiting": 0}


def test_stats_report_slots_as_blocks_of_max_model_len(default, new_seq, step, drain):
    scheduler = default(num_slots=4, max_model_len=128)
    scheduler.add(new_seq("a", 20, max_tokens=3))
    scheduler.add(new_seq("b", 5, max_tokens=3, first=100))
    step(scheduler)
    stats = scheduler.stats()
    assert (stats.kv.num_blocks, stats.kv.block_size, stats.kv.num_used_blocks) == (4, 128, 2)
    assert (stats.kv.num_live_tokens, stats.kv.num_reserved_tokens) == (27, 256)
    assert stats.num_preemptions == 0
    drain(scheduler)
    assert scheduler.stats().kv.num_used_blocks == 0
