"""What the worker really built: the report it sends the controller and prints at start-up."""

from __future__ import annotations

from dataclasses import dataclass

from intentserve.policy import RealizedCache
from intentserve.worker.engine.shaping import NORMS_AND_ACTIVATIONS, PROJECTIONS, ShapingStep


@dataclass(frozen=True)
class RealizedReport:
    cache: RealizedCache
    model: str  # the reference it was loaded from
    # What shaping the model did, pass by pass (shaping.py): which kernel runs the projections,
    # RMSNorm and SiLU, a decode step's layers, and why.
    shaping: tuple[ShapingStep, ...] = ()

    def _did(self, what: str) -> str:
        return next((step.did for step in self.shaping if step.what == what), "")

    @property
    def matmuls(self) -> str:
        return self._did(PROJECTIONS)

    @property
    def norms_and_activations(self) -> str:
        return self._did(NORMS_AND_ACTIVATIONS)

    @property
    def dtype(self) -> str:
        return self.cache.dtype

    @property
    def max_model_len(self) -> int:
        return self.cache.max_model_len

    def describe(self) -> str:
        c = self.cache
        scheduler = c.scheduler.value if c.scheduler else "none"
        lines = [
            f"model {self.model} ({self.dtype}), max_model_len {self.max_model_len}",
            f"cache {c.kind.value}, backend {c.backend.value}, scheduler {scheduler}",
            f"{c.num_blocks} blocks x {c.block_size} tokens, {c.kv_cache_bytes / 2**20:.1f} MiB "
            f"{c.kv_cache_dtype}, {c.describe_slots()}, "
            f"prefix caching {'on' if c.prefix_caching else 'off'}",
            f"weights {c.weight_format.value}, {c.weight_bytes / 2**20:.1f} MiB resident",
        ]
        if c.sliding_window:
            lines.append(c.describe_window())
        if c.stream_interval:
            lines.append(c.describe_stream())
        if c.attention_kernel:
            lines.append(f"attention: {c.attention_kernel}")
        lines += [f"{step.what}: {step.did}" for step in self.shaping]
        if c.decode_graphs:
            lines.append(f"decode steps: {c.decode_graphs}")
        if c.reasoning is not None:
            lines.append(c.reasoning.describe())
        if c.kernel_variant:
            lines.append(f"CPU kernels: the {c.kernel_variant} variant")
        lines += [f"fallback: {r.code.value}: {r.message}" for r in c.fallback_reasons]
        return "\n".join(lines)
