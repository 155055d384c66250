"""The resolved form of the PagedAttention intent.

`off -> None`, `auto -> PagedAttentionConfig(required=False)`,
`on -> PagedAttentionConfig(required=True)`.
The object travels unchanged from the CLI / manifest / SDK to the cache and the scheduler, so every
component can tell an optional optimization from a required serving policy.

Words are parsed once, at the edge that reads them (the manifest, the settings, the SDK's
`paged_attention_config`); `paged_attention_intent` takes the typed values and is the one place
that builds the config and refuses contradictions.
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

    @property
    def mode(self) -> Mode:
        return Mode.ON if self.required else Mode.AUTO

    def describe(self) -> str:
        return f"paged_attention: {self.mode.value}"


# The options of the paged cache; each has no effect when the mode is `off`.
PAGED_OPTIONS = ("block_size", "prefix_caching", "backend", "kv_cache_dtype")


def paged_attention_intent(
    mode: Mode,
    *,
    block_size: int | None = None,
    prefix_caching: Mode | None = None,
    backend: BackendIntent | None = None,
    kv_cache_dtype: KvCacheDtype | None = None,
) -> PagedAttentionConfig | None:
    """The config an intent resolves to, from typed values; `off` is None.

    An option left None was not given. An option given together with `off` can never take effect,
    so it is refused naming the option (prefix_caching `off` only repeats the mode and is allowed).
    """
    if mode is Mode.OFF:
        given = {
            "block_size": block_size,
            "prefix_caching": None if prefix_caching is Mode.OFF else prefix_caching,
            "backend": backend,
            "kv_cache_dtype": kv_cache_dtype,
        }
        for name in PAGED_OPTIONS:
            value = given[name]
            if value is not None:
                shown = (
                    value.value if isinstance(value, Mode | BackendIntent | KvCacheDtype) else value
                )
                raise IntentError(
                    name,
                    f"{shown!r} has no effect while paged_attention is 'off' (no paged cache is "
                    "built); remove it, or set the mode to auto or on",
                )
        return None
    return PagedAttentionConfig(
        required=mode is Mode.ON,
        block_size=DEFAULT_BLOCK_SIZE if block_size is None else block_size,
        prefix_caching=Mode.AUTO if prefix_caching is None else prefix_caching,
        backend=BackendIntent.AUTO if backend is None else backend,
        kv_cache_dtype=KvCacheDtype.AUTO if kv_cache_dtype is None else kv_cache_dtype,
    )


def paged_attention_config(
    mode: Mode | str | bool,
    *,
    block_size: int | None = None,
    prefix_caching: Mode | str | bool | None = None,
    backend: BackendIntent | str | None = None,
    kv_cache_dtype: KvCacheDtype | str | None = None,
) -> PagedAttentionConfig | None:
    """The SDK's edge: parse the words a caller writes (`"on"`, `backend="torch"`), then build the
    config with `paged_attention_intent`."""
    return paged_attention_intent(
        Mode.parse(mode, "paged_attention"),
        block_size=block_size,
        prefix_caching=None
        if prefix_caching is None
        else Mode.parse(prefix_caching, "prefix_caching"),
        backend=None if backend is None else BackendIntent.parse(backend, "backend"),
        kv_cache_dtype=None
        if kv_cache_dtype is None
        else KvCacheDtype.parse(kv_cache_dtype, "kv_cache_dtype"),
    )


def mode_of(config: PagedAttentionConfig | None) -> Mode:
    """The operator's mode, recovered from the resolved config."""
    return Mode.OFF if config is None else config.mode
