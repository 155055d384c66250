"""A `tokenizers` tokenizer rebuilt from GGUF metadata (`tokenizer.ggml.*`): byte-level BPE
(`tokenizer.ggml.model = "gpt2"`) or SentencePiece (`"llama"`, see gguf_sentencepiece)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import tokenizers
from gguf import TokenType
from intentserve.worker.model.gguf_sentencepiece import sentencepiece_backend
from intentserve.worker.model.tokenizer import Tokenizer
from tokenizers import AddedToken, Regex, decoders, pre_tokenizers

# The Llama 3 and Qwen2 splitting regexes, as llama.cpp applies them for these `tokenizer.ggml.pre`.
_LLAMA3_SPLIT = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
    r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
    r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class _PreTokenizerSpec:
    # None: the GPT-2 regex built into ByteLevel; else split with this regex first.
    split_regex: str | None = None
    # Every digit is its own pre-token (StarCoder family, SmolLM).
    digits_individually: bool = False
    # Whole words found in the vocab skip the merges (Llama 3).
    ignore_merges: bool = False


_PRE_TOKENIZERS: dict[str, _PreTokenizerSpec] = {
    "gpt-2": _PreTokenizerSpec(),
    "gpt2": _PreTokenizerSpec(),
    "smollm": _PreTokenizerSpec(digits_individually=True),
    "starcoder": _PreTokenizerSpec(digits_individually=True),
    "refact": _PreTokenizerSpec(digits_individually=True),
    "llama-bpe": _PreTokenizerSpec(split_regex=_LLAMA3_SPLIT, ignore_merges=True),
    "llama3": _PreTokenizerSpec(split_regex=_LLAMA3_SPLIT, ignore_merges=True),
    "qwen2": _PreTokenizerSpec(split_regex=_QWEN2_SPLIT),
}

_SPECIAL_TYPES = {TokenType.CONTROL, TokenType.UNKNOWN}

_END_TOKEN_KEYS = ("eos_token_id", "eot_token_id", "eom_token_id")
# Control tokens that end a chat turn, as llama.cpp also recognizes them by their text: a file
# that names no `eot_token_id` still stops there (Gemma's GGUF names only <eos>, yet its turns
# end with <end_of_turn>).
_END_OF_TURN_TEXTS = frozenset({"<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|end|>"})


@dataclass(frozen=True)
class _VocabularyKind:
    description: str
    build_backend: Callable[[Mapping[str, Any]], tokenizers.Tokenizer]
    # Whether BOS is added when `tokenizer.ggml.add_bos_token` is absent (llama.cpp's defaults).
    adds_bos_by_default: bool


def build_gguf_tokenizer(metadata: Mapping[str, Any]) -> Tokenizer:
    """ValueError names the metadata that is missing or not supported."""
    kind_name = metadata.get("tokenizer.ggml.model")
    kind = _VOCABULARY_KINDS.get(kind_name)
    if kind is None:
        supported = ", ".join(
            f"{name!r} ({k.description})" for name, k in _VOCABULARY_KINDS.items()
        )
        raise ValueError(
            f"tokenizer.ggml.model {kind_name!r} is not supported (supported: {supported})"
        )
    if metadata.get("tokenizer.ggml.add_eos_token", False):
        raise ValueError(
            "tokenizer.ggml.add_eos_token = true is not supported (supported: false; a prompt "
            "is continued by the model, never closed with EOS)"
        )
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    for key in ("scores", "token_type"):
        values = metadata.get(f"tokenizer.ggml.{key}")
        if values is not None and len(values) != len(tokens):
            raise ValueError(
                f"tokenizer.ggml.{key} has {len(values)} entries for {len(tokens)} tokens "
                "(it must have one per token)"
            )
    token_types = metadata.get("tokenizer.ggml.token_type")
    backend = kind.build_backend(metadata)
    _add_special_tokens(backend, tokens, token_types)
    return Tokenizer(
        backend,
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=_end_token_ids(metadata, tokens, token_types),
        add_bos_token=metadata.get("tokenizer.ggml.add_bos_token", kind.adds_bos_by_default),
        chat_template=metadata.get("tokenizer.chat_template"),
    )


def _end_token_ids(
    metadata: Mapping[str, Any], tokens: list[str], token_types: list[int] | None
) -> list[int]:
    ids = [metadata.get(f"tokenizer.ggml.{key}") for key in _END_TOKEN_KEYS]
    if metadata.get("tokenizer.ggml.eot_token_id") is None and token_types is not None:
        ids += [
            token_id
            for token_id, token in enumerate(tokens)
            if token in _END_OF_TURN_TEXTS and token_types[token_id] == TokenType.CONTROL
        ]
    return list(dict.fromkeys(token_id for token_id in ids if token_id is not None))


def _byte_level_backend(metadata: Mapping[str, Any]) -> tokenizers.Tokenizer:
    pre_name = metadata.get("tokenizer.ggml.pre", "gpt2")
    spec = _PRE_TOKENIZERS.get(pre_name)
    if spec is None:
        raise ValueError(
            f"tokenizer.ggml.pre {pre_name!r} is not supported "
            f"(supported: {sorted(_PRE_TOKENIZERS)})"
        )
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    merges = [tuple(merge.split(" ", 1)) for merge in metadata["tokenizer.ggml.merges"]]
    model = tokenizers.models.BPE(
        vocab={token: token_id for token_id, token in enumerate(tokens)},
        merges=merges,
        ignore_merges=spec.ignore_merges,
    )
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = _pre_tokenizer(
        spec, metadata.get("tokenizer.ggml.add_space_prefix", False)
    )
    backend.decoder = decoders.ByteLevel()
    return backend


_VOCABULARY_KINDS = {
    "gpt2": _VocabularyKind("byte-level BPE", _byte_level_backend, adds_bos_by_default=False),
    "llama": _VocabularyKind("SentencePiece", sentencepiece_backend, adds_bos_by_default=True),
}


def _pre_tokenizer(spec: _PreTokenizerSpec, add_prefix_space: bool) -> pre_tokenizers.PreTokenizer:
    steps: list[pre_tokenizers.PreTokenizer] = []
    if spec.digits_individually:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if spec.split_regex is not None:
        steps.append(pre_tokenizers.Split(Regex(spec.split_regex), behavior="isolated"))
    steps.append(
        pre_tokenizers.ByteLevel(
            add_prefix_space=add_prefix_space, use_regex=spec.split_regex is None
        )
    )
    return pre_tokenizers.Sequence(steps)


def _add_special_tokens(
    backend: tokenizers.Tokenizer, tokens: list[str], token_types: list[int] | None
) -> None:
    # Control tokens (e.g. <|im_start|>) must match as whole strings before BPE splits them, and
    # are dropped by decode(skip_special_tokens=True); user-defined ones match but are kept.
    if token_types is None:
        return
    special = [tokens[i] for i, t in enumerate(token_types) if t in _SPECIAL_TYPES]
    user_defined = [tokens[i] for i, t in enumerate(token_types) if t == TokenType.USER_DEFINED]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in user_defined])
