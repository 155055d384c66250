"""Decode steps replayed from CUDA graphs captured at start-up (the triton_paged backend).

A small model's decode step on a GPU is bound by its kernel launches, not by the GPU: hundreds of
launches a step, each a few microseconds of host time. A CUDA graph records one step's launches
for a batch size once and replays them in one call. Everything the step reads is in static
buffers (input ids, positions, the KV slots, the block tables, the context lengths, the tiles),
so a step copies its values in and replays the graph of the smallest captured size that holds it.

Padding rows (a batch of 5 replayed in the graph of 8) have slot -1 (store_kv writes nothing) and
context length 0 (the attention kernel reads nothing, writes zeros); their hidden states are
never read. A step with any prefill chunk, or more sequences than the largest graph, runs eagerly.

The graph itself is injectable (`make_graph`): on a CPU, tests replay through `EagerStepGraph`,
which re-runs the captured step into the same output, so the buffers, padding and metadata a real
graph replays are checked against the eager path under Triton's interpreter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from intentserve.worker.attention.batch import StepBatch
from intentserve.worker.attention.triton_paged import TritonMetadata, TritonPagedAttention
from torch import Tensor


class StepGraph(Protocol):
    def capture(self, step: Callable[[], Tensor]) -> Tensor: ...

    def replay(self) -> None: ...


class CudaStepGraph:
    """torch.cuda.CUDAGraph over one batch size; every size shares one memory pool."""

    def __init__(self, pool) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool

    def capture(self, step: Callable[[], Tensor]) -> Tensor:
        # NOTE: a warm-up run on a side stream first (Triton compiles at its first launch, and
        # the allocator settles); capture then records launches only.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(self.graph, pool=self.pool):
            out = step()
        return out

    def replay(self) -> None:
        self.graph.replay()


class EagerStepGraph:
    """The CPU stand-in: `replay` re-runs the step into the captured output tensor."""

    def __init__(self, pool=None) -> None:
        self.step: Callable[[], Tensor] | None = None
        self.out: Tensor | None = None

    def capture(self, step: Callable[[], Tensor]) -> Tensor:
        self.step, self.out = step, step()
        return self.out

    def replay(self) -> None:
        self.out.copy_(self.step())


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to max_num_seqs (and max_num_seqs itself)."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_num_seqs]
    sizes += range(16, max_num_seqs, 16)
    return sorted({*sizes, max_num_seqs})


class DecodeGraphs:
    def __init__(
        self,
        model,
        attention: TritonPagedAttention,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        device: torch.device,
        make_graph: Callable[[object], StepGraph] | None = None,
    ) -> None:
        self.model = model
        self.attention = attention
        self.max_num_seqs = max_num_seqs
        if make_graph is None:
            pool = torch.cuda.graph_pool_handle()
            make_graph = lambda _pool=pool: CudaStepGraph(_pool)  # noqa: E731
        self.make_graph = make_graph

        def buffer(*shape: int, dtype=torch.int32) -> Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        n = max_num_seqs
        self.input_ids = buffer(n, dtype=torch.int64)
        self.positions = buffer(n, dtype=torch.int64)
        self.slots = buffer(n, dtype=torch.int64)
        self.tables = buffer(n, max_blocks_per_seq)
        self.context_lens = buffer(n)
        self.query_start = torch.arange(n + 1, dtype=torch.int32, device=device)  # one token each
        self.tile_seq = torch.arange(n, dtype=torch.int32, device=device)
        self.tile_q0 = buffer(n)
        self.graphs: dict[int, tuple[StepGraph, Tensor]] = {}
        self.sizes: list[int] = []  # the captured batch sizes, ascending
        self.capture_s = 0.0

    def _meta(self, size: int) -> TritonMetadata:
        return TritonMetadata(
            slot_mapping=self.slots[:size],
            tables=self.tables[:size],
            context_lens=self.context_lens[:size],
            query_start=self.query_start[: size + 1],
            tile_seq=self.tile_seq[:size],
            tile_q0=self.tile_q0[:size],
            block_q=self.attention.block_q(decode_only=True),
        )

    def capture(self, sizes: Sequence[int]) -> DecodeGraphs:
        """One graph per batch size, largest first (the smaller ones reuse its memory). The
        buffers hold padding while capturing: every row writes and reads nothing."""
        start = time.perf_counter()
        self.slots.fill_(-1)
        self.context_lens.zero_()
        for size in sorted(sizes, reverse=True):
            meta = self._meta(size)
            graph = self.make_graph(None)

            def step(size=size, meta=meta) -> Tensor:
                return self.model(
                    self.input_ids[:size], self.positions[:size], self.attention, meta
                )

            self.graphs[size] = (graph, graph.capture(step))
        self.sizes = sorted(self.graphs)
        self.capture_s = time.perf_counter() - start
        return self

    def describe(self) -> str:
        sizes = self.sizes
        return (
            f"CUDA graphs for {len(sizes)} batch sizes ({sizes[0]}-{sizes[-1]}) "
            f"captured in {self.capture_s:.2f} s"
        )

    def run(self, batch: StepBatch, input_ids: Tensor) -> Tensor | None:
        """The step's hidden states [B, hidden] from a graph; None where it is not a decode step
        a graph holds (the caller runs it eagerly)."""
        num_seqs = batch.num_seqs
        if num_seqs > self.max_num_seqs or any(n != 1 for n in batch.query_lens):
            return None
        size = next(s for s in self.sizes if s >= num_seqs)
        graph, out = self.graphs[size]
        width = batch.tables.shape[1]
        self.input_ids[:num_seqs].copy_(input_ids)
        self.positions[:num_seqs].copy_(batch.positions)
        self.slots[:num_seqs].copy_(batch.slot_mapping)
        self.tables[:num_seqs, :width].copy_(batch.tables)
        self.context_lens[:num_seqs].copy_(
            torch.tensor(batch.context_lens, dtype=torch.int32), non_blocking=True
        )
        # Rows past the batch are padding (a previous, larger step may have left values there).
        self.slots[num_seqs:size].fill_(-1)
        self.context_lens[num_seqs:size].zero_()
        graph.replay()
        return out[:num_seqs]
