"""Tokenizing leaves the interpreter to the other threads (issue 60): a worker tokenizes on its
gRPC threads while its engine loop steps in Python, and an `encode` that held the GIL for the
whole of a long text stalled every step meanwhile."""

from __future__ import annotations

import threading
import time

from intentserve.worker.model.tokenizer import Tokenizer

from tests.worker.model.tiny_checkpoints import tiny_tokenizer

TEXT = "a " * 400_000  # about 0.4 s to tokenize here


def test_another_thread_runs_python_while_a_long_text_is_tokenized():
    tokenizer = Tokenizer(
        tiny_tokenizer(),
        bos_token_id=None,
        eos_token_ids=(),
        add_bos_token=False,
        chat_template=None,
    )
    ticks: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    thread = threading.Thread(target=tick)
    thread.start()
    try:
        time.sleep(0.01)
        started_s = time.perf_counter()
        ids = tokenizer.encode(TEXT)
        finished_s = time.perf_counter()
    finally:
        stop.set()
        thread.join()
    assert len(ids) == 400_001  # `a` then ` a` each time
    # NOTE: with the GIL held throughout, no tick could fall inside; released, about one a ms.
    inside = [t for t in ticks if started_s < t < finished_s]
    assert len(inside) >= 10, f"{len(inside)} ticks in {finished_s - started_s:.3f} s of encode"
