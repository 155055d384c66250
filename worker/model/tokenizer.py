"""Text <-> token ids for one model: encode, decode, streaming detokenization, chat template."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import tokenizers
from intentserve.common.chat_template import ChatTemplate
from intentserve.worker.model.token_bound import token_bound

# Tokens of prompt context the streaming decoder starts from: decoders that strip a leading
# space (SentencePiece) need the previous token to render the first new one correctly.
_NUM_CONTEXT_TOKENS = 5


class Tokenizer:
    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token_id: int | None,
        eos_token_ids: Sequence[int],
        add_bos_token: bool,
        chat_template: str | None,
    ) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.add_bos_token = add_bos_token
        self.use_chat_template(chat_template)
        self._bound = token_bound(backend)

    def min_num_tokens(self, utf8: bytes) -> int:
        """The fewest tokens the text `utf8` can encode to, known without tokenizing it (0 when
        this tokenizer gives no bound; see token_bound)."""
        return 0 if self._bound is None else self._bound.min_num_tokens(utf8)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of text; add_bos=None follows the checkpoint's own `add_bos_token`.

        Special-token strings in text (e.g. `<|im_start|>`) become their single ids, so a rendered
        chat prompt encodes as the model was trained on it.
        """
        # NOTE: encode_batch, not encode: only it lets go of the GIL while it works, and a worker
        # tokenizes on its gRPC threads while the engine loop steps in Python (a 2.6 MB prompt
        # held the interpreter for 3 s).
        ids = self.backend.encode_batch([text], add_special_tokens=False)[0].ids
        wants_bos = self.add_bos_token if add_bos is None else add_bos
        if wants_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def use_chat_template(self, source: str | None) -> None:
        """Render conversations through `source` (None: none); ValueError when it does not
        compile."""
        self._template = None if source is None else ChatTemplate(source)

    def with_chat_template(self, source: str) -> Tokenizer:
        """This tokenizer with another chat template (the operator's, `spec.model.chatTemplate`);
        this one is unchanged."""
        other = copy.copy(self)
        other.use_chat_template(source)
        return other

    @property
    def chat_template(self) -> str | None:
        return None if self._template is None else self._template.source

    def template_reads(self, variable: str) -> bool:
        """Whether the chat template reads `variable` (`tools`) from what it is given."""
        return self._template is not None and variable in self._template.variables

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """Render a conversation to prompt text.

        ValueError when the model has no template or the template refuses the messages.
        """
        if self._template is None:
            raise ValueError("this model has no chat template; send a plain prompt instead")
        bos = None if self.bos_token_id is None else self.token_text(self.bos_token_id)
        eos = self.token_text(self.eos_token_ids[0]) if self.eos_token_ids else None
        return self._template.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=bos or "",
            eos_token=eos or "",
            **extra,
        )


class IncrementalDecoder:
    """Turns a stream of generated ids into text deltas without splitting multi-byte characters.

    Each `append` decodes only a short window: the text of the window's older ids is subtracted
    from the text of the whole window. A delta ending in U+FFFD means a character is still
    incomplete, so nothing is emitted until its remaining bytes arrive.
    """

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids = list(prompt_ids[-_NUM_CONTEXT_TOKENS:])
        self._prefix_offset = 0  # start of the decoding window
        self._read_offset = len(self._ids)  # ids before this have been emitted

    def append(self, new_ids: Sequence[int]) -> str:
        """Return the text that `new_ids` complete (possibly "")."""
        self._ids.extend(new_ids)
        decode = self._tokenizer.decode
        prefix_text = decode(
            self._ids[self._prefix_offset : self._read_offset], self._skip_special_tokens
        )
        full_text = decode(self._ids[self._prefix_offset :], self._skip_special_tokens)
        if len(full_text) <= len(prefix_text) or full_text.endswith("\ufffd"):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full_text[len(prefix_text) :]
