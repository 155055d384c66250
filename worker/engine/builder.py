"""Building an engine: load the model, apply the policy, realize the KV cache, pick the scheduler.

Embedding the engine directly:

    engine = EngineBuilder().model("smollm2-135m").paged_attention("on").build()

An explicit `paged_attention("on")` is a requirement: where it cannot be honoured, `build()` raises
the actionable `PagedAttentionRequiredError` instead of quietly serving without it.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field, replace

import torch
from intentserve.policy import (
    DEFAULT_AUTO_DEVICES,
    DeviceKind,
    PagedAttentionConfig,
    Resolution,
    paged_attention_config,
    resolve,
)
from intentserve.worker.capability import probe_capability
from intentserve.worker.engine.engine import Engine
from intentserve.worker.engine.kv_setup import realize_kv, realize_without_cache
from intentserve.worker.engine.policy_apply import apply_resolution
from intentserve.worker.engine.recompute_runner import RecomputeRunner
from intentserve.worker.engine.runner import ModelRunner
from intentserve.worker.model.cpu_ops import enable_fused_ops
from intentserve.worker.model.facts import model_facts, serving_max_model_len
from intentserve.worker.model.loaded import LoadedModel, ModelLoadError
from intentserve.worker.model.packed_linear import prepack_available, prepack_linears
from intentserve.worker.model.registry import load_model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    model: str = "smollm2-135m"
    dtype: str = "auto"
    device: str = "cpu"
    paged: PagedAttentionConfig | None = field(
        default_factory=lambda: paged_attention_config("auto")
    )
    max_model_len: int | None = None  # default: the model's, capped at DEFAULT_MAX_MODEL_LEN
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    kv_cache_bytes: int | None = None  # budget when the paged config carries none
    kv_cache_fraction: float | None = None
    device_map: tuple[str, ...] = ()  # device of each decoder layer; empty: all on `device`
    no_kv_cache: bool = False  # debug mode: no KV cache at all
    auto_enabled_devices: frozenset[DeviceKind] = DEFAULT_AUTO_DEVICES
    cpu_prepack: bool = True  # oneDNN-packed projection weights on CPU (packed_linear.py)


def build_engine(
    config: EngineConfig, resolution: Resolution | None = None, loaded: LoadedModel | None = None
) -> Engine:
    """`resolution` comes from the controller on a worker; standalone, it is resolved here with
    the same policy functions."""
    loaded = loaded or load_model(config.model, config.dtype, config.device)
    max_model_len = serving_max_model_len(loaded.config, config.max_model_len)
    device = torch.device(config.device)
    capability = probe_capability(
        device,
        model_facts(loaded.config, max_model_len),
        device_map=config.device_map,
        no_kv_cache=config.no_kv_cache,
    )
    if resolution is None:
        resolution = resolve(config.paged, capability, config.auto_enabled_devices)
    fallback_reasons: list = []
    paged = apply_resolution(config.paged, resolution, fallback_reasons.append)
    if loaded.model is None or loaded.tokenizer is None:
        raise ModelLoadError(
            loaded.source_path,
            f"{loaded.config.architecture} is not a decoder language model; it cannot generate",
        )
    if capability.mixed_device_map:
        # The policy has had its say (`on` was refused above, naming the reason); what is left
        # is a limit of this engine, which runs every layer on one device.
        raise ValueError(
            "device_map: layers on several devices "
            f"({', '.join(sorted(d.value for d in capability.devices))}) are not supported by "
            "this engine; place every layer on one device"
        )
    if config.no_kv_cache:
        scheduler, report = realize_without_cache(
            requested=config.paged,
            fallback_reasons=tuple(fallback_reasons),
            loaded=loaded,
            max_model_len=max_model_len,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            model_ref=config.model,
        )
        runner = RecomputeRunner(loaded.model, device)
        return Engine(
            tokenizer=loaded.tokenizer,
            scheduler=scheduler,
            runner=runner,
            realized=report,
            max_model_len=max_model_len,
        )
    kv = realize_kv(
        requested=config.paged,
        paged=paged,
        resolution=resolution,
        fallback_reasons=tuple(fallback_reasons),
        loaded=loaded,
        capability=capability,
        device=device,
        max_model_len=max_model_len,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        default_budget=(config.kv_cache_bytes, config.kv_cache_fraction),
        model_ref=config.model,
    )
    realized = kv.realized
    if device.type == "cpu":
        if config.cpu_prepack:
            available, why = prepack_available()
            if available:
                prepack_linears(loaded.model)
            else:
                log.info("projection weights stay unpacked: %s", why)
        realized = replace(realized, norms_and_activations=enable_fused_ops(loaded.model))
    runner = ModelRunner(loaded.model, kv.attention, kv.pool.block_size, device)
    return Engine(
        tokenizer=loaded.tokenizer,
        scheduler=kv.scheduler,
        runner=runner,
        realized=realized,
        max_model_len=max_model_len,
    )


class EngineBuilder:
    """Fluent construction of an `EngineConfig`; each setter validates what it is given."""

    def __init__(self) -> None:
        self._config = EngineConfig()
        self._paged_mode: str = "auto"
        self._paged_options: dict = {}

    def _set(self, **changes) -> EngineBuilder:
        self._config = dataclasses.replace(self._config, **changes)
        return self

    def model(self, ref: str) -> EngineBuilder:
        return self._set(model=ref)

    def dtype(self, dtype: str) -> EngineBuilder:
        return self._set(dtype=dtype)

    def device(self, device: str, device_map: tuple[str, ...] = ()) -> EngineBuilder:
        return self._set(device=device, device_map=tuple(device_map))

    def paged_attention(self, mode: str, **options) -> EngineBuilder:
        """mode auto/on/off; options: block_size, kv_cache_bytes, kv_cache_fraction,
        prefix_caching, backend, kv_cache_dtype (see policy.paged_attention_config)."""
        paged_attention_config(mode, **options)  # validate now, so the error points here
        self._paged_mode, self._paged_options = mode, options
        return self

    def scheduler(
        self,
        *,
        max_num_seqs: int | None = None,
        max_model_len: int | None = None,
        max_num_batched_tokens: int | None = None,
    ) -> EngineBuilder:
        changes = {
            "max_num_seqs": max_num_seqs,
            "max_model_len": max_model_len,
            "max_num_batched_tokens": max_num_batched_tokens,
        }
        changes = {k: v for k, v in changes.items() if v is not None}
        for name, value in changes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        return self._set(**changes)

    def kv_cache_memory(
        self, *, bytes: int | None = None, fraction: float | None = None
    ) -> EngineBuilder:
        return self._set(kv_cache_bytes=bytes, kv_cache_fraction=fraction)

    def no_kv_cache(self, enabled: bool = True) -> EngineBuilder:
        return self._set(no_kv_cache=enabled)

    def auto_enabled_devices(self, *devices: str) -> EngineBuilder:
        return self._set(auto_enabled_devices=frozenset(DeviceKind(d) for d in devices))

    @property
    def config(self) -> EngineConfig:
        return dataclasses.replace(
            self._config, paged=paged_attention_config(self._paged_mode, **self._paged_options)
        )

    def build(self, loaded: LoadedModel | None = None) -> Engine:
        return build_engine(self.config, loaded=loaded)
