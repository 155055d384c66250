"""The resolved form of the PagedAttention intent.

`off -> None`, `auto -> PagedAttentionConfig(required=False)`,
`on -> PagedAttentionConfig(required=True)`.
The object travels unchanged from the CLI / manifest / SDK to the cache and the scheduler, so every
component can tell an optional optimization from a required serving policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from intentserve.policy.errors import IntentError
from intentserve.policy.modes import BackendIntent, KvCacheDtype, Mode

DEFAULT_BLOCK_SIZE = 16
MAX_BLOCK_SIZE = 1024


@dataclass(frozen=True)
class PagedAttentionConfig:
    required: bool
    block_size: int = DEFAULT_BLOCK_SIZE
    # At most one of the two budgets; neither means the engine's default fraction of free memory.
    kv_cache_bytes: int | None = None
    kv_cache_fraction: float | None = None
    prefix_caching: Mode = Mode.AUTO
    backend: BackendIntent = BackendIntent.AUTO
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int):
            raise IntentError("block_size", f"must be an integer, got {self.block_size!r}")
        if not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            raise IntentError(
                "block_size",
                f"must be between 1 and {MAX_BLOCK_SIZE} tokens, got {self.block_size}",
            )
        if self.kv_cache_bytes is not None and self.kv_cache_fraction is not None:
            raise IntentError(
                "kv_cache_memory", "give either kv_cache_bytes or kv_cache_fraction, not both"
            )
        if self.kv_cache_bytes is not None and (
            not isinstance(self.kv_cache_bytes, int) or self.kv_cache_bytes <= 0
        ):
            raise IntentError(
                "kv_cache_bytes", f"must be a positive integer, got {self.kv_cache_bytes!r}"
            )
        if self.kv_cache_fraction is not None and not 0.0 < self.kv_cache_fraction <= 1.0:
            raise IntentError(
                "kv_cache_fraction", f"must be in (0, 1], got {self.kv_cache_fraction!r}"
            )

    @property
    def mode(self) -> Mode:
        return Mode.ON if self.required else Mode.AUTO

    def describe(self) -> str:
        return f"paged_attention: {self.mode.value}"


def paged_attention_config(
    mode: Mode | str | bool,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    kv_cache_bytes: int | None = None,
    kv_cache_fraction: float | None = None,
    prefix_caching: Mode | str | bool = Mode.AUTO,
    backend: BackendIntent | str = BackendIntent.AUTO,
    kv_cache_dtype: KvCacheDtype | str = KvCacheDtype.AUTO,
) -> PagedAttentionConfig | None:
    """Build the config an intent resolves to; `off` is None (nothing to realize or attempt)."""
    mode = Mode.parse(mode, "paged_attention")
    prefix_mode = Mode.parse(prefix_caching, "prefix_caching")
    backend_intent = BackendIntent.parse(backend, "attention_backend")
    dtype = KvCacheDtype.parse(kv_cache_dtype, "kv_cache_dtype")
    if mode is Mode.OFF:
        # Prefix caching lives in the paged block pool: asking for it with paging off contradicts.
        if prefix_mode is Mode.ON:
            raise IntentError(
                "prefix_caching", "'on' needs a paged KV cache, but paged_attention is 'off'"
            )
        return None
    return PagedAttentionConfig(
        required=mode is Mode.ON,
        block_size=block_size,
        kv_cache_bytes=kv_cache_bytes,
        kv_cache_fraction=kv_cache_fraction,
        prefix_caching=prefix_mode,
        backend=backend_intent,
        kv_cache_dtype=dtype,
    )


def mode_of(config: PagedAttentionConfig | None) -> Mode:
    """The operator's mode, recovered from the resolved config."""
    return Mode.OFF if config is None else config.mode
