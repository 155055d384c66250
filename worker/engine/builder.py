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
from intentserve.policy import (
    DEFAULT_AUTO_DEVICES,
    Capability,
    DeviceKind,
    IntentError,
    KvBudget,
    Mode,
    PagedAttentionConfig,
    PagedAttentionRequiredError,
    Reason,
    ReasonCode,
    Resolution,
    WeightChoice,
    WeightFormat,
    paged_attention_config,
    paged_attention_intent,
    resolve,
)
from intentserve.policy.config import PAGED_OPTIONS
from intentserve.worker.attention.cpu_kernels import gguf_gemm_kernel
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
from intentserve.worker.engine.recompute_runner import RecomputeRunner
from intentserve.worker.engine.runner import ModelRunner
from intentserve.worker.hugepages import huge_page_bytes, move_weights_to_huge_pages, thp_mode
from intentserve.worker.model.calibration import CALIBRATION_TEXT
from intentserve.worker.model.cpu_ops import enable_fused_ops, enable_int8_gemm
from intentserve.worker.model.decode_layers import CompiledDecode
from intentserve.worker.model.facts import model_facts, serving_max_model_len
from intentserve.worker.model.loaded import LoadedModel, ModelLoadError
from intentserve.worker.model.native_weights import NativeWeightsError, hold_native
from intentserve.worker.model.packed_linear import prepack_available, prepack_linears
from intentserve.worker.model.quant_linear import WeightShapeError
from intentserve.worker.model.registry import load_model
from intentserve.worker.model.step_buffers import keep_step_buffers
from intentserve.worker.model.weight_format import (
    held_format,
    quantize_linears,
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
    loaded = loaded or load_model(config.model, config.dtype, config.device)
    device = torch.device(config.device)
    limits = SchedulerLimits(
        serving_max_model_len(loaded.config, config.max_model_len),
        config.max_num_seqs,
        config.max_num_batched_tokens,
    )
    capability = capability or _probe(config, loaded, limits.max_model_len)
    resolution = resolution or resolve(
        config.paged, capability, config.auto_enabled_devices, config.weights
    )
    holding = _hold_weights(resolution.weights, loaded)
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
        runner = RecomputeRunner(loaded.model, device, eos_token_ids, grammars)
    else:
        kv = realize_kv(request, loaded, capability.free_memory_bytes, device)
        runner = ModelRunner(
            loaded.model, kv.attention, kv.pool.block_size, device, eos_token_ids, grammars
        )
        runner.graphs = _decode_graphs(config, loaded, kv, limits, device)
    # Packed before the weights are counted: a tied head's packed copy is resident too.
    matmuls = "; ".join(filter(None, (_pack_for_cpu(config, loaded, device), holding)))
    _weights_on_huge_pages(loaded, device)
    norms = enable_fused_ops(loaded.model) if device.type == "cpu" else ""
    if device.type == "cpu" and loaded.model is not None:
        keep_step_buffers(loaded.model)
    realized = RealizedReport(
        cache=dataclasses.replace(
            kv.cache,
            weight_format=_held_format(loaded),
            weight_bytes=resident_weight_bytes(loaded.model),
            attention_kernel=kv.attention.decode_impl if kv.attention is not None else "",
            decode_graphs=_describe_graphs(runner),
        ),
        model=config.model,
        matmuls=matmuls,
        norms_and_activations=norms,
        decode_layers=_compile_decode(loaded, kv.attention, device),
    )
    return Engine(
        tokenizer=loaded.tokenizer,
        scheduler=kv.scheduler,
        runner=runner,
        realized=realized,
        max_model_len=limits.max_model_len,
        grammars=grammars,
    )


def _hold_weights(choice: WeightChoice, loaded: LoadedModel) -> str:
    """Quantize the projections where the resolution says so (native: keep the file's blocks);
    returns what native holds how, in words ("" otherwise). A format that cannot be realized
    stops the build with its reason: there is no fallback to dequantized."""
    if choice.rejection is not None:
        raise PagedAttentionRequiredError(
            choice.rejection, f"weights: {choice.intent.value}", subject="The weight format"
        )
    if choice.format is WeightFormat.DEQUANTIZED or loaded.model is None:
        return ""
    try:
        if choice.format is WeightFormat.NATIVE:
            holding = hold_native(loaded, gguf_gemm_kernel()).describe()
            log.info("weights held native: %s", holding)
            return holding
        calibration = None
        if choice.format is WeightFormat.W8A8 and loaded.tokenizer is not None:
            calibration = loaded.tokenizer.encode(CALIBRATION_TEXT)
        count = quantize_linears(loaded.model, choice.format, calibration)
    except (WeightShapeError, NativeWeightsError) as error:
        reason = Reason(
            ReasonCode.WEIGHT_FORMAT_UNAVAILABLE,
            f"this model cannot be held as {choice.format.value}: {error}",
        )
        raise PagedAttentionRequiredError(
            reason, f"weights: {choice.intent.value}", subject="The weight format"
        ) from None
    log.info("%d projections held as %s (%s)", count, choice.format.value, choice.reason.message)
    return ""


def _held_format(loaded: LoadedModel) -> WeightFormat:
    return WeightFormat.DEQUANTIZED if loaded.model is None else held_format(loaded.model)


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


def _compile_decode(loaded: LoadedModel, attention, device: torch.device) -> str:
    """Every layer of a decode step in one compiled call, where the model allows; says which."""
    if device.type != "cpu" or attention is None or not hasattr(loaded.model, "compiled_decode"):
        return ""
    compiled, why = CompiledDecode.build(loaded.model, attention)
    loaded.model.compiled_decode = compiled
    return "one compiled call per step" if compiled else f"per-layer Python ({why})"


def _describe_graphs(runner) -> str:
    graphs = getattr(runner, "graphs", None)  # the recompute runner has none
    return graphs.describe() if graphs is not None else ""


def _decode_graphs(config: EngineConfig, loaded: LoadedModel, kv, limits, device: torch.device):
    """Decode steps as CUDA graphs, captured now (part of start-up, and logged), where the
    worker is on CUDA with the Triton backend; None otherwise."""
    if not (config.cuda_graphs and device.type == "cuda"):
        return None
    if not isinstance(kv.attention, TritonPagedAttention):
        log.info("decode steps run eagerly: CUDA graphs need the triton_paged backend")
        return None
    graphs = DecodeGraphs(
        loaded.model,
        kv.attention,
        limits.max_num_seqs,
        -(-limits.max_model_len // kv.pool.block_size),
        device,
    ).capture(capture_sizes(limits.max_num_seqs))
    log.info("%s", graphs.describe())
    return graphs


def _weights_on_huge_pages(loaded: LoadedModel, device: torch.device) -> None:
    """The packed projection weights moved into one mapping on 2 MiB pages (hugepages.py), before
    the compiled step takes their addresses; logs what the kernel granted."""
    if device.type != "cpu" or loaded.model is None:
        return
    moved = move_weights_to_huge_pages(loaded.model)
    if moved:
        first = next(t for name, t in loaded.model.named_buffers() if name.endswith("packed"))
        log.info(
            "%d MiB of packed weights in one mapping, %d MiB of it on 2 MiB pages "
            "(transparent huge pages: %s)",
            moved >> 20,
            huge_page_bytes(first) >> 20,
            thp_mode(),
        )


def _pack_for_cpu(config: EngineConfig, loaded: LoadedModel, device: torch.device) -> str:
    """The projections' weights packed for the CPU matmul that runs them; says which runs."""
    if device.type != "cpu" or loaded.model is None:
        return ""
    held = _held_format(loaded)
    if held is WeightFormat.W8A8:
        return enable_int8_gemm(loaded.model)
    if held is WeightFormat.NATIVE:
        return f"GGUF block kernel ({gguf_gemm_kernel().isa()})"
    if held is not WeightFormat.DEQUANTIZED:
        return f"torch's {held.value} kernels"
    if not config.cpu_prepack:
        return "torch F.linear (packing turned off)"
    available, why = prepack_available()
    if not available:
        log.info("projection weights stay unpacked: %s", why)
        return f"torch F.linear ({why})"
    return prepack_linears(loaded.model)


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
