"""Preparing a request: every check of its content, once, and its prompt tokenized.

    prepared = preparer.prepare("Hello", SamplingParams(max_tokens=8))  # InvalidRequestError
    engine.add(prepared)                                                # names the field

Cheap limits come before the costly work, so a refused request costs at most what tokenizing a
prompt of max_model_len densest tokens costs: a conversation is counted (chat.check_size) and
measured by the text it carries (`Conversation.kept_text`) before it is rendered, and any prompt
text by its byte count (`tokenizer.min_num_tokens`) before it is tokenized; a prompt that still
cannot fit is refused by its token count, naming `prompt` or `messages`. It reads no engine
state, so any thread may call it: the serving loop prepares requests off its own thread, and only
adding the prepared request touches the engine. What costs CPU waits its turn: one request renders
at a time, and texts are tokenized one at a time on the preparer's own thread, at a lower CPU
priority than the engine's steps (TOKENIZER_NICE).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from collections.abc import Sequence as Seq
from concurrent.futures import ThreadPoolExecutor

from intentserve.common.ids import new_request_id, request_id_problem
from intentserve.policy import ReasoningFormat
from intentserve.worker.engine.chat import Conversation
from intentserve.worker.engine.grammar import GrammarCompiler
from intentserve.worker.engine.reasoning import reply_phase
from intentserve.worker.engine.request import PreparedRequest
from intentserve.worker.engine.sampling import InvalidRequestError, SamplingParams
from intentserve.worker.model.tokenizer import Tokenizer

# How much lower the CPU priority (the nice value) of the thread that tokenizes is than serving's:
# in its time, the engine's steps come first. NOTE: a thread tokenizing at the steps' priority
# made every step of 8 streams 1.65x slower on 2 cores (median); at nice 10 or 19, none slower.
TOKENIZER_NICE = 10


def _lower_priority() -> None:
    """Lower the calling thread's CPU priority by TOKENIZER_NICE (Linux, where a thread has a
    nice value of its own; elsewhere it would lower the whole process's, so not there)."""
    if sys.platform == "linux":
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + TOKENIZER_NICE)


class RequestPreparer:
    """The checks and the tokenizing of one engine's requests (its tokenizer, grammars, model
    length and vocabulary)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        grammars: GrammarCompiler,
        *,
        max_model_len: int,
        vocab_size: int,
        reasoning: ReasoningFormat | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.reasoning = reasoning  # a thinking model's markers; None: it does not think
        self.grammars = grammars
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        # NOTE: the template's Jinja is pure Python (it holds the GIL), so it renders at the
        # caller's priority, where a lower one could keep the GIL from the engine loop.
        self._rendering = threading.Lock()
        self._tokenizer_thread = ThreadPoolExecutor(
            1, thread_name_prefix="tokenize", initializer=_lower_priority
        )

    def prepare(
        self,
        prompt: str | Seq[int] | Conversation,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        chat: bool = False,
    ) -> PreparedRequest:
        """Check and tokenize a request: text (with `chat`, as the user's turn through the
        model's chat template), a whole conversation (through the template) or token ids.
        InvalidRequestError names the field. `max_tokens=None` becomes what the model length
        leaves after the prompt."""
        params = params or SamplingParams()
        if request_id and (problem := request_id_problem(request_id)) is not None:
            raise InvalidRequestError("request_id", problem)
        self._check_in_vocab("logit_bias", [t for t, _ in params.logit_bias])
        self._check_in_vocab("stop_token_ids", params.stop_token_ids)
        if params.constraint is not None:
            self.grammars.compile(params.constraint)  # cached: a schema is compiled once
        chat = chat or isinstance(prompt, Conversation)
        self._check_reasoning_budget(params, chat)
        prompt_ids, rendered = self._prompt_ids(prompt, chat)
        if params.max_tokens is None:
            params = dataclasses.replace(params, max_tokens=self.max_model_len - len(prompt_ids))
        if params.max_tokens > self.max_model_len - len(prompt_ids):
            raise InvalidRequestError(
                "max_tokens",
                f"{params.max_tokens} does not fit: the prompt has {len(prompt_ids)} tokens and "
                f"max_model_len is {self.max_model_len} (at most "
                f"{self.max_model_len - len(prompt_ids)})",
            )
        parses = isinstance(prompt, Conversation) and prompt.parses_tool_calls
        phase = None
        if self.reasoning is not None and rendered is not None and params.constraint is None:
            phase = reply_phase(self.reasoning, rendered)
        return PreparedRequest(
            request_id or new_request_id(), tuple(prompt_ids), params, parses, phase
        )

    def _check_reasoning_budget(self, params: SamplingParams, chat: bool) -> None:
        """A thinking budget is honoured on a chat reply of a thinking model, with neither a
        grammar (it holds the reply from its first token, thinking included) nor logprobs (the
        end marker is the worker's, not sampled)."""
        if params.reasoning_budget is None:
            return
        problem = None
        if self.reasoning is None:
            problem = (
                "this model does not think (its chat template and vocabulary have no reasoning "
                "markers); leave it out"
            )
        elif not chat:
            problem = "applies to a chat reply (messages, or chat: true), which the template opens"
        elif params.constraint is not None:
            problem = (
                "not served with structured outputs or a forced tool call (the grammar holds the "
                "reply from its first token, thinking included); leave one out"
            )
        elif params.logprobs is not None:
            problem = (
                "not served with logprobs (the end marker at the budget is written by the "
                "worker, not sampled); leave one out"
            )
        if problem is not None:
            raise InvalidRequestError("reasoning_budget", problem)

    def tokenize(self, prompt: str | Conversation, add_bos: bool | None = None) -> list[int]:
        """The ids `prepare` computes for `prompt` (add_bos None: the checkpoint's own choice),
        every one, even past max_model_len; what cannot fit max_model_len by its bytes is
        refused untokenized, as `prepare` refuses it."""
        if isinstance(prompt, Conversation):
            text, field = self._render(prompt), "messages"
        elif not prompt:
            raise InvalidRequestError("prompt", "must not be empty (or give messages)")
        else:
            text, field = prompt, "prompt"
        self._check_text_fits(field, text)
        return self._encode_off(text, add_bos)

    def detokenize(self, token_ids: Seq[int]) -> str:
        """The text of `token_ids`, special tokens rendered: at most max_model_len of them, the
        most one sequence holds."""
        if len(token_ids) > self.max_model_len:
            raise InvalidRequestError(
                "tokens",
                f"has {len(token_ids)} ids; at most {self.max_model_len} (max_model_len)",
            )
        self._check_in_vocab("tokens", token_ids)
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    def _check_in_vocab(self, field: str, token_ids: Seq[int]) -> None:
        """Token ids a request names must be the model's (logit_bias and min_tokens index the
        logits by them)."""
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                field, f"ids {bad[:5]} are outside the vocabulary (0..{self.vocab_size - 1})"
            )

    def _prompt_ids(
        self, prompt: str | Seq[int] | Conversation, chat: bool
    ) -> tuple[list[int], str | None]:
        """The prompt's ids, and its text as the chat template rendered it (None: not a chat)."""
        if isinstance(prompt, Conversation):
            rendered = self._render(prompt)
            return self._encode(rendered, "messages"), rendered
        if len(prompt) == 0:
            raise InvalidRequestError("prompt", "must not be empty (or give prompt_token_ids)")
        if not isinstance(prompt, str):
            if chat:
                raise InvalidRequestError("chat", "applies to a text prompt, not to token ids")
            self._check_prompt_fits("prompt_token_ids", len(prompt))
            self._check_in_vocab("prompt_token_ids", prompt)
            return list(prompt), None
        if not chat:
            return self._encode(prompt, "prompt"), None
        self._check_text_fits("prompt", prompt)  # NOTE: cheap first: before rendering
        with self._rendering:
            rendered = Conversation.user(prompt).render(self.tokenizer, field="chat")
        return self._encode(rendered, "prompt"), rendered

    def _render(self, conversation: Conversation) -> str:
        """The conversation's prompt text; refused unrendered when the text it carries cannot
        fit max_model_len."""
        num_tokens = self.tokenizer.min_num_tokens(conversation.kept_text())
        self._check_prompt_fits("messages", num_tokens, at_least=True)
        with self._rendering:
            return conversation.render(self.tokenizer)

    def _encode(self, text: str, field: str) -> list[int]:
        self._check_text_fits(field, text)
        prompt_ids = self._encode_off(text)
        if not prompt_ids:
            raise InvalidRequestError(
                field, "makes no tokens (this tokenizer drops every character in it)"
            )
        self._check_prompt_fits(field, len(prompt_ids))
        return prompt_ids

    def _encode_off(self, *args) -> list[int]:
        """`tokenizer.encode(*args)` on the tokenizer's thread, waited for."""
        return self._tokenizer_thread.submit(self.tokenizer.encode, *args).result()

    def _check_text_fits(self, field: str, text: str) -> None:
        """Refuse `text` untokenized when its bytes alone show that it cannot fit."""
        try:
            utf8 = text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise InvalidRequestError(
                field, f"is not valid Unicode text (character {error.start})"
            ) from None
        self._check_prompt_fits(field, self.tokenizer.min_num_tokens(utf8), at_least=True)

    def _check_prompt_fits(self, field: str, num_tokens: int, at_least: bool = False) -> None:
        if num_tokens >= self.max_model_len:
            raise InvalidRequestError(
                field,
                f"has {'at least ' * at_least}{num_tokens} tokens; at most "
                f"{self.max_model_len - 1} fit max_model_len={self.max_model_len}",
            )
