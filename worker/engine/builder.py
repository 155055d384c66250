"""Building an engine: load the model, apply the policy, realize the KV cache, pick the scheduler.

Embedding the engine directly (`intentserve.LLM` is the short front door built on this):

    engine = EngineBuilder().model("smollm2-135m").paged_attention("on").build()

An explicit `paged_attention("on")` is a requirement: where it cannot be honoured, `build()` raises
the actionable `PagedAttentionRequiredError` instead of quietly serving without it.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import torch
from intentserve.common.chat_template import ChatTemplate
from intentserve.policy import (
    DEFAULT_AUTO_DEVICES,
    Capability,
    DeviceKind,
    IntentError,
    KvBudget,
    Mode,
    PagedAttentionConfig,
    Reason,
    Resolution,
    WeightFormat,
    paged_attention_config,
    paged_attention_intent,
    resolve,
)
from intentserve.policy.config import PAGED_OPTIONS
from intentserve.worker.attention.triton_paged import TritonPagedAttention
from intentserve.worker.capability import probe_capability
from intentserve.worker.engine.cuda_graphs import DecodeGraphs, capture_sizes
from intentserve.worker.engine.engine import Engine
from intentserve.worker.engine.grammar import GrammarCompiler
from intentserve.worker.engine.kv_setup import (
    KvRequest,
    SchedulerLimits,
    realize_kv,
    realize_without_cache,
)
from intentserve.worker.engine.policy_apply import apply_resolution
from intentserve.worker.engine.realized import RealizedReport
from intentserve.worker.engine.reasoning import detect_reasoning
from intentserve.worker.engine.recompute_runner import RecomputeRunner
from intentserve.worker.engine.runner import ModelRunner
from intentserve.worker.engine.shaping import held_weight_format, shape_model
from intentserve.worker.kernels import loaded_variant
from intentserve.worker.model.facts import model_facts, serving_max_model_len
from intentserve.worker.model.loaded import LoadedModel, ModelLoadError
from intentserve.worker.model.registry import load_model
from intentserve.worker.model.weight_format import (
    resident_weight_bytes,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    model: str = "smollm2-135m"
    dtype: str = "auto"
    device: str = "cpu"
    paged: PagedAttentionConfig | None = field(
        default_factory=lambda: paged_attention_intent(Mode.AUTO)
    )
    kv_budget: KvBudget = KvBudget()  # in every mode; neither field set: the device's default
    max_model_len: int | None = None  # default: the model's, capped at DEFAULT_MAX_MODEL_LEN
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    device_map: tuple[str, ...] = ()  # device of each decoder layer; empty: all on `device`
    no_kv_cache: bool = False  # debug mode: no KV cache at all
    auto_enabled_devices: frozenset[DeviceKind] = DEFAULT_AUTO_DEVICES
    cpu_prepack: bool = True  # oneDNN-packed projection weights on CPU (packed_linear.py)
    weights: WeightFormat = WeightFormat.AUTO  # how the projection weights are held
    # The operator's chat template (`spec.model.chatTemplate`), in place of the checkpoint's;
    # None: the checkpoint's own (if it has one).
    chat_template: str | None = None
    # Decode steps replayed from CUDA graphs where the attention backend allows (cuda_graphs.py);
    # False: every step runs eagerly (the A/B the GPU check measures).
    cuda_graphs: bool = True


def build_engine(
    config: EngineConfig,
    loaded: LoadedModel | None = None,
    capability: Capability | None = None,
    resolution: Resolution | None = None,
) -> Engine:
    """On a worker, `capability` and `resolution` are what the controller resolved against;
    standalone, the capability is probed and the intent resolved here by the same policy."""
    device = torch.device(config.device)
    # Before the model loads: a forced kernel variant this CPU cannot run refuses the start.
    kernel_variant = loaded_variant() if device.type == "cpu" else ""
    loaded = loaded or load_model(config.model, config.dtype, config.device)
    limits = SchedulerLimits(
        serving_max_model_len(loaded.config, config.max_model_len),
        config.max_num_seqs,
        config.max_num_batched_tokens,
    )
    capability = capability or _probe(config, loaded, limits.max_model_len)
    resolution = resolution or resolve(
        config.paged, capability, config.auto_enabled_devices, config.weights
    )
    fallback_reasons: list[Reason] = []
    paged = apply_resolution(config.paged, resolution, fallback_reasons.append)  # checkpoint 2
    _require_generative(loaded)
    _require_one_device(capability)
    request = KvRequest(
        config.paged, paged, resolution, tuple(fallback_reasons), config.kv_budget, limits
    )
    grammars = GrammarCompiler(loaded.tokenizer)
    eos_token_ids = loaded.tokenizer.eos_token_ids
    if config.no_kv_cache:
        kv = realize_without_cache(request, loaded)
    else:
        kv = realize_kv(request, loaded, capability.free_memory_bytes, device)
    # The one step that rewrites the model: weights held, kernels wired (shaping.py).
    shaped = shape_model(loaded, resolution.weights, kv.attention, device, config.cpu_prepack)
    if config.no_kv_cache:
        runner = RecomputeRunner(shaped.model, device, eos_token_ids, grammars)
    else:
        runner = ModelRunner(
            shaped.model, kv.attention, kv.pool.block_size, device, eos_token_ids, grammars
        )
        runner.graphs = _decode_graphs(config, shaped.model, kv, limits, device)
    tokenizer = (
        loaded.tokenizer
        if config.chat_template is None
        else loaded.tokenizer.with_chat_template(config.chat_template)
    )
    realized = RealizedReport(
        cache=dataclasses.replace(
            kv.cache,
            reasoning=detect_reasoning(tokenizer),
            weight_format=held_weight_format(loaded),
            # Counted after the packing: a tied head's packed copy is resident too.
            weight_bytes=resident_weight_bytes(shaped.model),
            attention_kernel=kv.attention.decode_impl if kv.attention is not None else "",
            decode_graphs=_describe_graphs(runner),
            kernel_variant=kernel_variant,
            weights_held=shaped.holding,
        ),
        model=config.model,
        shaping=shaped.steps,
    )
    return Engine(
        tokenizer=tokenizer,
        scheduler=kv.scheduler,
        runner=runner,
        realized=realized,
        max_model_len=limits.max_model_len,
        grammars=grammars,
    )


def _probe(config: EngineConfig, loaded: LoadedModel, max_model_len: int) -> Capability:
    return probe_capability(
        config.device,
        model_facts(loaded.config, max_model_len),
        device_map=config.device_map,
        no_kv_cache=config.no_kv_cache,
    )


def _require_generative(loaded: LoadedModel) -> None:
    if loaded.model is None or loaded.tokenizer is None:
        raise ModelLoadError(
            loaded.source_path,
            f"{loaded.config.architecture} is not a decoder language model; it cannot generate",
        )


def _require_one_device(capability: Capability) -> None:
    # The policy has had its say (`on` was refused above, naming the reason); what is left is a
    # limit of this engine, which runs every layer on one device.
    if capability.mixed_device_map:
        raise ValueError(
            "device_map: layers on several devices "
            f"({', '.join(sorted(d.value for d in capability.devices))}) are not supported by "
            "this engine; place every layer on one device"
        )


def _describe_graphs(runner) -> str:
    graphs = getattr(runner, "graphs", None)  # the recompute runner has none
    return graphs.describe() if graphs is not None else ""


def _decode_graphs(config: EngineConfig, model, kv, limits, device: torch.device):
    """Decode steps as CUDA graphs, captured now (part of start-up, and logged), where the
    worker is on CUDA with the Triton backend; None otherwise."""
    if not (config.cuda_graphs and device.type == "cuda"):
        return None
    if not isinstance(kv.attention, TritonPagedAttention):
        log.info("decode steps run eagerly: CUDA graphs need the triton_paged backend")
        return None
    graphs = DecodeGraphs(
        model,
        kv.attention,
        limits.max_num_seqs,
        -(-limits.max_model_len // kv.pool.block_size),
        device,
    ).capture(capture_sizes(limits.max_num_seqs))
    log.info("%s", graphs.describe())
    return graphs


class EngineBuilder:
    """Fluent construction of an `EngineConfig`; each setter validates what it is given, once."""

    def __init__(self) -> None:
        self._config = EngineConfig()

    def _set(self, **changes) -> EngineBuilder:
        self._config = dataclasses.replace(self._config, **changes)
        return self

    def model(self, ref: str) -> EngineBuilder:
        return self._set(model=ref)

    def dtype(self, dtype: str) -> EngineBuilder:
        return self._set(dtype=dtype)

    def chat_template(self, source: str | None) -> EngineBuilder:
        """The template conversations are rendered through, in place of the checkpoint's (for a
        checkpoint with none); ValueError naming `chat_template` when it does not compile."""
        if source is not None:
            try:
                ChatTemplate(source)
            except ValueError as error:
                raise ValueError(f"chat_template: {error}") from None
        return self._set(chat_template=source)

    def device(self, device: str, device_map: tuple[str, ...] = ()) -> EngineBuilder:
        return self._set(device=device, device_map=tuple(device_map))

    def paged_attention(self, mode: str | Mode, **options) -> EngineBuilder:
        """mode auto/on/off; options: block_size, prefix_caching, backend, kv_cache_dtype (each
        refused with `off`, where it could not take effect). The KV budget is not an option of
        the paged cache: `kv_cache_memory()` sets it, in every mode."""
        for name in options:
            if name in ("kv_cache_bytes", "kv_cache_fraction", "kv_cache_memory"):
                raise IntentError(
                    name, "the KV budget is set with kv_cache_memory(), which applies in every mode"
                )
            if name not in PAGED_OPTIONS:
                raise IntentError(name, f"unknown option; allowed: {', '.join(PAGED_OPTIONS)}")
        return self._set(paged=paged_attention_config(mode, **options))

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
        return self._set(kv_budget=KvBudget(num_bytes=bytes, fraction=fraction))

    def weights(self, fmt: str | WeightFormat) -> EngineBuilder:
        """auto, dequantized, int8, int4, w8a8 or native (`spec.model.weights`); an explicit
        format this worker cannot hold makes `build()` raise with the reason."""
        return self._set(weights=WeightFormat.parse(fmt, "weights"))

    def cuda_graphs(self, enabled: bool = True) -> EngineBuilder:
        """Replay decode steps from CUDA graphs (where the backend allows); False: eager."""
        return self._set(cuda_graphs=enabled)

    def no_kv_cache(self, enabled: bool = True) -> EngineBuilder:
        return self._set(no_kv_cache=enabled)

    def auto_enabled_devices(self, *devices: str) -> EngineBuilder:
        return self._set(auto_enabled_devices=frozenset(DeviceKind(d) for d in devices))

    @property
    def config(self) -> EngineConfig:
        return self._config

    def build(self, loaded: LoadedModel | None = None) -> Engine:
        return build_engine(self._config, loaded=loaded)
