"""llama.cpp's side of bench/native_gguf.py, run by the llama-cpp-python venv's own interpreter (it
imports nothing of intentserve): greedy decoding of N sequences in parallel on one context
(`n_seq_max` = N, one llama_batch a step holding a token of every sequence), as its batched
example does. Prints one JSON line: tok/s over the whole run (prompts included), as the engine
side is timed, and the seconds the model took to load.

    <llama venv>/bin/python bench/gguf_peer.py FILE --streams N --tokens T --threads K
"""

from __future__ import annotations

import argparse
import json
import os
import time

import llama_cpp
import numpy as np


def _add(batch, token: int, pos: int, seq: int, logits: bool) -> int:
    i = batch.n_tokens
    batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
    batch.seq_id[i][0], batch.logits[i] = seq, logits
    batch.n_tokens = i + 1
    return i


def run(path: str, streams: int, tokens: int, threads: int, prompts: list[str]) -> dict:
    start = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=path, n_ctx=64, n_threads=threads, verbose=bool(os.environ.get("PEER_VERBOSE"))
    )
    # The high-level object's context holds one sequence: a context of our own holds them all.
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_seq_max = streams * 256, streams
    params.n_batch = params.n_ubatch = max(512, streams * 64)
    params.n_threads = params.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(llm.model, params)
    load_s = time.perf_counter() - start
    ids = [llm.tokenize(prompts[i % len(prompts)].encode()) for i in range(streams)]
    n_vocab = llm.n_vocab()
    batch = llama_cpp.llama_batch_init(max(512, sum(len(p) for p in ids)), 0, streams)
    start = time.perf_counter()
    rows = [0] * streams
    for seq, prompt in enumerate(ids):
        for pos, token in enumerate(prompt):
            rows[seq] = _add(batch, token, pos, seq, pos == len(prompt) - 1)
    positions = [len(p) for p in ids]
    for _ in range(tokens):
        status = llama_cpp.llama_decode(ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")
        picked = []
        for seq in range(streams):
            logits = np.ctypeslib.as_array(
                llama_cpp.llama_get_logits_ith(ctx, rows[seq]), shape=(n_vocab,)
            )
            picked.append(int(logits.argmax()))
        batch.n_tokens = 0
        for seq, token in enumerate(picked):
            rows[seq] = _add(batch, token, positions[seq], seq, True)
            positions[seq] += 1
    elapsed = time.perf_counter() - start
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    return {"tok_s": streams * tokens / elapsed, "load_s": load_s}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", default="[]", help="a JSON list of prompts")
    args = parser.parse_args()
    prompts = json.loads(args.prompts) or ["Once upon a time"]
    print(json.dumps(run(args.path, args.streams, args.tokens, args.threads, prompts)))


if __name__ == "__main__":
    main()
