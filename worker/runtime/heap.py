"""The worker's Python heap once its engine is built.

Loading leaves ~800,000 objects that the cyclic garbage collector walks in every full
collection: most of them are the parsed GGUF header (gguf's reader keeps a numpy view for every
part of every metadata field, ~250,000 for SmolLM2's 49,152-token vocabulary, each with its own
dict), cached so that the capability probe and the load parse the file once. With them, one full
collection took 255-265 ms on the 2-core EPYC (SmolLM2-135M, bf16): a pause of every stream of
the worker, at a time no request chose. Once the engine is built the parse is dropped, and what
is left (the model's modules, the tokenizer, the imported code) lives as long as the process, so
it is moved out of the collector's generations (`gc.freeze`): a full collection then walks only
what serving allocated since.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

from intentserve.worker.model.gguf_loader import forget_opened


@dataclass(frozen=True)
class SettledHeap:
    frozen_objects: int  # objects the collector no longer walks
    seconds: float  # the collection before the freeze


def settle_heap() -> SettledHeap:
    """Drop the load's caches, collect once, and freeze what remains (see the module's note).
    Call it after the engine is built, before serving."""
    forget_opened()
    start = time.perf_counter()
    gc.collect()
    gc.freeze()
    return SettledHeap(gc.get_freeze_count(), time.perf_counter() - start)
