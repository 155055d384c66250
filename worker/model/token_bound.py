"""How few tokens a text can make, known without tokenizing it: a cheap limit the engine applies
before the expensive one (a 3.9 MB prompt took 2.3 s to tokenize on this CPU, only to be refused
for its length).

Byte-level BPE with no normalizer turns each byte of the input into one character of its
256-character alphabet, and a token covers exactly as many input bytes as its vocabulary string
has characters. So a text of B bytes makes at least ceil(B / L) tokens, L being the longest
token. Bytes whose character is missing from the vocabulary are dropped (or become an unknown
token that covers nothing else), so they are not counted. An added token (`<|im_start|>`)
covers its content.

SentencePiece as gguf_sentencepiece builds it only grows its input: a space becomes a 3-byte
`▁`, a `▁` may be put before the text, and a character outside the vocabulary becomes one byte
token per byte (or the unknown token, which stands for one character of at most 4 bytes). So no
token covers more input bytes than its own UTF-8 length, or 4, and nothing is dropped, provided
every byte has its token or there is an unknown token.

Any other tokenizer may drop or shrink its input in ways the vocabulary does not tell (a
normalizer, a pre-tokenizer that removes text, an added token that swallows the whitespace beside
it): it gets no bound, and its prompts are only measured by tokenizing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import tokenizers
from intentserve.worker.model.gguf_sentencepiece import SPACE_MARKER

# Pre-tokenizers that split byte-level text without dropping any of it ("Split" unless it
# removes what it matches).
_KEEPING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Digits", "Split"})

_SPACE_TO_MARKER = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE_MARKER}
_MAX_UTF8_BYTES_PER_CHAR = 4  # what the unknown token may stand for


@dataclass(frozen=True)
class TokenBound:
    max_bytes_per_token: int  # the most input bytes one token covers
    dropped_bytes: bytes  # byte values that no token covers

    def min_num_tokens(self, utf8: bytes) -> int:
        """The fewest tokens the text `utf8` can make (linear, at C speed)."""
        num_bytes = len(utf8.translate(None, self.dropped_bytes))
        return -(-num_bytes // self.max_bytes_per_token)


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character that stands for each byte value -> the byte.
    Printable Latin-1 bytes stand for themselves; the others are shifted past U+0100."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in printable]
    chars = {chr(b): b for b in printable}
    return chars | {chr(0x100 + i): b for i, b in enumerate(shifted)}


def _is_byte_level(pre_tokenizer: dict[str, Any] | None) -> bool:
    """Whether a (serialized) pre-tokenizer is byte-level and drops nothing."""
    if pre_tokenizer is None:
        return False
    parts = pre_tokenizer.get("pretokenizers", [pre_tokenizer])
    return any(p["type"] == "ByteLevel" for p in parts) and all(
        p["type"] in _KEEPING_PRE_TOKENIZERS and p.get("behavior") != "Removed" for p in parts
    )


def _is_sentencepiece(backend: tokenizers.Tokenizer) -> bool:
    """Whether the backend only writes spaces as `▁` (and may prepend one), then runs BPE with
    a token for every byte or an unknown token."""
    if backend.normalizer is None or backend.pre_tokenizer is not None:
        return False
    normalizer = _state(backend.normalizer)
    steps = normalizer.get("normalizers", [normalizer])
    if steps not in (
        [_SPACE_TO_MARKER],
        [{"type": "Prepend", "prepend": SPACE_MARKER}, _SPACE_TO_MARKER],
    ):
        return False
    model = backend.model
    every_byte = all(backend.token_to_id(f"<0x{b:02X}>") is not None for b in range(256))
    return model.byte_fallback and (every_byte or model.unk_token is not None)


def token_bound(backend: tokenizers.Tokenizer) -> TokenBound | None:
    """The bound for a byte-level BPE or SentencePiece tokenizer; None for any other."""
    if not isinstance(backend.model, tokenizers.models.BPE):
        return None
    added = list(backend.get_added_tokens_decoder().values())
    if any(token.lstrip or token.rstrip for token in added):
        return None
    vocab = backend.get_vocab(with_added_tokens=False)
    longest_added = max((len(token.content.encode("utf-8")) for token in added), default=0)
    pre = backend.pre_tokenizer
    if backend.normalizer is None and _is_byte_level(None if pre is None else _state(pre)):
        dropped = bytes(sorted(b for char, b in byte_level_alphabet().items() if char not in vocab))
        return TokenBound(max(longest_added, *(len(token) for token in vocab)), dropped)
    if _is_sentencepiece(backend):
        longest = max(len(token.encode("utf-8")) for token in vocab)
        return TokenBound(max(longest_added, longest, _MAX_UTF8_BYTES_PER_CHAR), b"")
    return None


def _state(part: Any) -> dict[str, Any]:
    return json.loads(part.__getstate__())
