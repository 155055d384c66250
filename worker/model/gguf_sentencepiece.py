"""A SentencePiece vocabulary from GGUF metadata (`tokenizer.ggml.model = "llama"`) as a
`tokenizers` BPE model.

SentencePiece (and llama.cpp's SPM tokenizer) encodes a run of text by starting from its
characters and repeatedly joining the adjacent pair whose joined string is the best-scored piece
of the vocabulary, the leftmost pair on ties; a character that is no piece becomes its UTF-8
bytes, spelled `<0xNN>`. Spaces are written `▁` first.

A BPE model does the same when it is given, for every normal piece and every split of it into
two pieces, a merge ranked by the piece's score: its ranks then order joins as the scores do.
NOTE: two limits, neither met by Gemma 3's vocabulary nor by random texts in the tests: a join
whose halves are not both pieces cannot be a merge (it matters only for a piece containing a
character that is no piece), and two splits of one piece rank apart where SentencePiece would
take the leftmost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tokenizers
from gguf import TokenType
from tokenizers import decoders, normalizers

SPACE_MARKER = "\u2581"  # ▁


def sentencepiece_backend(metadata: Mapping[str, Any]) -> tokenizers.Tokenizer:
    """The model, normalizer and decoder; special tokens are added by the caller."""
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    unknown_id = metadata.get("tokenizer.ggml.unknown_token_id")
    model = tokenizers.models.BPE(
        vocab={token: token_id for token_id, token in enumerate(tokens)},
        merges=_merges_by_score(
            tokens, metadata["tokenizer.ggml.scores"], metadata["tokenizer.ggml.token_type"]
        ),
        unk_token=None if unknown_id is None else tokens[unknown_id],
        byte_fallback=True,
    )
    backend = tokenizers.Tokenizer(model)
    # llama.cpp's default for this vocabulary type is to add the prefix.
    add_space_prefix = metadata.get("tokenizer.ggml.add_space_prefix", True)
    backend.normalizer = _normalizer(add_space_prefix)
    steps = [decoders.Replace(SPACE_MARKER, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(steps)
    return backend


def _normalizer(add_space_prefix: bool) -> normalizers.Normalizer:
    # NOTE: normalizers run on each stretch of text between special tokens, so the prefix goes
    # at the start and after every special token, as llama.cpp puts it; a Metaspace pre-tokenizer
    # would skip it where the text already starts with a space.
    replace = normalizers.Replace(" ", SPACE_MARKER)
    if not add_space_prefix:
        return replace
    return normalizers.Sequence([normalizers.Prepend(SPACE_MARKER), replace])


def _merges_by_score(
    tokens: list[str], scores: list[float], token_types: list[int]
) -> list[tuple[str, str]]:
    """Every split of every normal piece into two pieces, best score first (then lower id, then
    longer left half)."""
    known = set(tokens)
    # NOTE: sorting the ~255k pieces, not the ~500k merges, and the plain loop below keep this
    # to about a second for Gemma's 262k-piece vocabulary.
    normal_ids = [i for i, token_type in enumerate(token_types) if token_type == TokenType.NORMAL]
    normal_ids.sort(key=lambda i: -scores[i])  # stable: lower id first among equal scores
    merges: list[tuple[str, str]] = []
    for token_id in normal_ids:
        token = tokens[token_id]
        for cut in range(len(token) - 1, 0, -1):
            left = token[:cut]
            if left in known:
                right = token[cut:]
                if right in known:
                    merges.append((left, right))
    return merges
