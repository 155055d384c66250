"""Text <-> token ids for one model: encode, decode, streaming detokenization, chat template."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.meta
import tokenizers
from intentserve.worker.model.token_bound import token_bound
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Tokens of prompt context the streaming decoder starts from: decoders that strip a leading
# space (SentencePiece) need the previous token to render the first new one correctly.
_NUM_CONTEXT_TOKENS = 5


def _raise_exception(message: str) -> None:
    # Chat templates call this to reject conversations they cannot render (e.g. bad role order).
    raise jinja2.TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    # jinja2's own tojson HTML-escapes '<' and '>', which would corrupt prompts.
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _strftime_now(fmt: str) -> str:
    # Llama 3.1 style templates stamp the current date into the system prompt.
    return datetime.now().strftime(fmt)


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile in a sandbox: a template comes from the checkpoint, i.e. from a stranger.

    ValueError when the template is not valid Jinja.
    """
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"chat template does not compile: {exc}") from exc


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
        self.chat_template = chat_template
        self._template = None if chat_template is None else compile_chat_template(chat_template)
        self._template_variables = (
            frozenset()
            if chat_template is None
            else jinja2.meta.find_undeclared_variables(
                self._template.environment.parse(chat_template)
            )
        )
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
        ids = self.backend.encode(text, add_special_tokens=False).ids
        wants_bos = self.add_bos_token if add_bos is None else add_bos
        if wants_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def template_reads(self, variable: str) -> bool:
        """Whether the chat template reads `variable` (`tools`) from what it is given."""
        return variable in self._template_variables

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
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=bos or "",
                eos_token=eos or "",
                **extra,
            )
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template rejected the messages: {exc}") from exc


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
