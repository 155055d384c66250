"""The engine loop: schedule, run, postprocess; plus the request surface around it.

output = scheduler.schedule()
samples = runner.run(output, seq_of)
stops = {seq_id: why for each sampled token that ends its request}  # EOS, stop ids, stop strings
scheduler.abort(seq_id, ERROR) for each request that failed alone (sampling, stop checks, logits)
finished = scheduler.postprocess(output, samples.tokens, stops)

Control flows down: the engine decides which tokens end a request and tells the scheduler, which
never calls back into the engine.

A request owns its failures: an error in its sampling, detokenizing or stop checks ends that
request alone (finish_reason ERROR, with the cause) and its batch mates go on unchanged. Only the
step itself (the model forward) raises, and that fails the whole batch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator
from collections.abc import Sequence as Seq

from intentserve.common.choices import choice_id, choice_seed
from intentserve.common.ids import new_request_id, request_id_problem
from intentserve.worker.engine.chat import Conversation
from intentserve.worker.engine.grammar import GrammarCompiler
from intentserve.worker.engine.realized import RealizedReport
from intentserve.worker.engine.request import (
    LogprobEntry,
    OutputLogprobs,
    PreparedRequest,
    RequestOutput,
    RequestState,
)
from intentserve.worker.engine.runner import Runner
from intentserve.worker.engine.sampler import TokenLogprobs
from intentserve.worker.engine.sampling import InvalidRequestError, SamplingParams
from intentserve.worker.engine.tool_calls import ToolCallParser
from intentserve.worker.model.tokenizer import IncrementalDecoder, Tokenizer
from intentserve.worker.sched.scheduler import Scheduler
from intentserve.worker.sched.sequence import FinishReason, Sequence

log = logging.getLogger(__name__)


class Engine:
    def __init__(
        self,
        *,
        tokenizer: Tokenizer,
        scheduler: Scheduler,
        runner: Runner,
        realized: RealizedReport,
        max_model_len: int,
        grammars: GrammarCompiler,
    ) -> None:
        self.tokenizer = tokenizer
        self.grammars = grammars  # the runner's sampler's too: requests are compiled here
        self.scheduler = scheduler
        self.runner = runner
        self.realized = realized
        self.max_model_len = max_model_len
        self._requests: dict[str, RequestState] = {}
        self._seqs: dict[str, Sequence] = {}

    # -- requests ----------------------------------------------------------------------------

    def prepare(
        self,
        prompt: str | Seq[int] | Conversation,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        chat: bool = False,
    ) -> PreparedRequest:
        """Check and tokenize a request: text (with `chat`, as the user's turn through the
        model's chat template), a whole conversation (through the template) or token ids. It
        reads no engine state, so any thread may call it (the serving loop tokenizes off its own
        thread). Every check of a request's content happens here, once, cheap limits before
        tokenizing; InvalidRequestError names the field. `max_tokens=None` becomes what the
        model length leaves after the prompt."""
        params = params or SamplingParams()
        if request_id and (problem := request_id_problem(request_id)) is not None:
            raise InvalidRequestError("request_id", problem)
        self._check_token_ids(params)
        if params.constraint is not None:
            self.grammars.compile(params.constraint)  # cached: a schema is compiled once
        prompt_ids = self._prompt_ids(prompt, chat)
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
        return PreparedRequest(request_id or new_request_id(), tuple(prompt_ids), params, parses)

    def tokenize(self, prompt: str | Conversation, add_bos: bool | None = None) -> list[int]:
        """The ids `prepare` computes for `prompt` (add_bos None: the checkpoint's own choice),
        with no limit on their number; any thread may call it."""
        if isinstance(prompt, Conversation):
            prompt = prompt.render(self.tokenizer)
        elif not prompt:
            raise InvalidRequestError("prompt", "must not be empty (or give messages)")
        return self.tokenizer.encode(prompt, add_bos)

    def detokenize(self, token_ids: Seq[int]) -> str:
        """The text of `token_ids`, special tokens rendered; any thread may call it."""
        vocab = self.runner.model.config.vocab_size
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(
                "tokens", f"ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})"
            )
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    def add(self, request: PreparedRequest) -> str:
        """Queue a prepared request; its id must not be in flight already."""
        return self.add_choices(request, 1)[0]

    def add_choices(self, request: PreparedRequest, n: int) -> list[str]:
        """Queue `n` samples of one prepared request (OpenAI's `n`): the request, and choices
        named and seeded as `choices.py` says. Their prompt is computed once: each choice forks
        from the first, sharing its prompt's KV (a paged cache; with prompt logprobs asked for,
        each computes its own prompt, whose logits it reports)."""
        self.check_num_choices(n)
        ids = [choice_id(request.request_id, i) for i in range(n)]
        for request_id in ids:
            if request_id in self._requests:
                raise InvalidRequestError("request_id", f"{request_id!r} is already in flight")

        def alone(request_id: str, params: SamplingParams) -> Sequence:
            return Sequence(
                request_id,
                list(request.prompt_ids),
                params.max_tokens,
                params=params,
                reuses_prefix_cache=params.prompt_logprobs is None,
            )

        first = alone(ids[0], request.params)
        self._queue(first, request.parses_tool_calls, 0)
        for i, request_id in enumerate(ids[1:], start=1):
            params = request.params
            if params.seed is not None:
                params = dataclasses.replace(params, seed=choice_seed(params.seed, i))
            if first.reuses_prefix_cache:
                seq = first.fork(request_id, params)
            else:
                seq = alone(request_id, params)
            self._queue(seq, request.parses_tool_calls, i)
        return ids

    def check_num_choices(self, n: int) -> None:
        """InvalidRequestError naming `n` unless 1 <= n <= max_num_seqs (every choice must be
        able to run at once); any thread may call it (a server checks before taking slots)."""
        limit = self.scheduler.max_num_seqs
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= limit:
            raise InvalidRequestError(
                "n", f"{n!r} choices; allowed: 1 to {limit} (this worker's maxNumSeqs)"
            )

    def _queue(self, seq: Sequence, parses_tool_calls: bool, index: int) -> None:
        request_id = seq.seq_id
        self.scheduler.add(seq)
        decoder = IncrementalDecoder(self.tokenizer, list(seq.prompt_token_ids))
        parser = ToolCallParser() if parses_tool_calls else None
        self._requests[request_id] = RequestState(request_id, seq.params, decoder, parser, index)
        self._seqs[request_id] = seq

    def add_request(
        self,
        prompt: str | Seq[int] | Conversation,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        chat: bool = False,
    ) -> str:
        """`prepare` then `add`, on the caller's thread."""
        return self.add(self.prepare(prompt, params, request_id, chat=chat))

    def abort(self, request_id: str) -> bool:
        """Stop a request and free its KV; False when it is unknown or already finished."""
        if not self.scheduler.abort(request_id):
            return False
        self._forget(request_id)
        return True

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # -- the loop ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        output = self.scheduler.schedule()
        if output.is_empty:
            return []
        # NOTE: an exception from the runner is the step's own (the forward): the caller fails
        # the batch. Whatever belongs to one request comes back as a value.
        samples = self.runner.run(output, self._seqs.__getitem__)
        failures = dict(samples.failures)
        for seq_id, scores in samples.prompt_logprobs.items():
            if seq_id in self._requests:
                self._requests[seq_id].prompt_scores.update(scores)
        stops: dict[str, FinishReason] = {}
        for seq_id, token_id in samples.tokens.items():
            try:
                if seq_id in samples.logprobs and seq_id in self._requests:
                    self._requests[seq_id].logprobs.append(self._named(samples.logprobs[seq_id]))
                reason = self._stop_reason(seq_id, token_id, seq_id in samples.complete)
            except Exception as error:
                log.exception("detokenizing or stop checks failed for request %s", seq_id)
                failures[seq_id] = f"detokenizing or stop checks: {type(error).__name__}: {error}"
                continue
            if reason is not None:
                stops[seq_id] = reason
        failed = [self._fail(seq_id, cause) for seq_id, cause in failures.items()]
        sampled = {s: t for s, t in samples.tokens.items() if s not in failures}
        finished = {seq.seq_id for seq in self.scheduler.postprocess(output, sampled, stops)}
        outputs = [self._output(seq_id, seq_id in finished) for seq_id in sampled]
        for seq_id in finished:
            self._forget(seq_id)
        return outputs + [out for out in failed if out is not None]

    def stream(self) -> Iterator[RequestOutput]:
        """Run until every request finishes, yielding deltas as they are produced."""
        while self.has_unfinished:
            yield from self.step()

    def generate(
        self,
        prompts: Iterable[str | Seq[int] | Conversation],
        params: SamplingParams | None = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion; one combined output per prompt, in order.

        A prompt that cannot be served raises before any runs: those queued before it are aborted.
        """
        order: list[str] = []
        try:
            for prompt in prompts:
                order.append(self.add_request(prompt, params))
        except Exception:
            for request_id in order:
                self.abort(request_id)
            raise
        tokens: dict[str, list[int]] = {r: [] for r in order}
        text: dict[str, list[str]] = {r: [] for r in order}
        lps: dict[str, list] = {r: [] for r in order}
        prompt_lps: dict[str, tuple] = {r: () for r in order}
        calls: dict[str, list] = {r: [] for r in order}
        last: dict[str, RequestOutput] = {}
        for out in self.stream():
            tokens[out.request_id] += out.new_token_ids
            lps[out.request_id] += out.logprobs
            prompt_lps[out.request_id] = prompt_lps[out.request_id] or out.prompt_logprobs
            text[out.request_id].append(out.new_text)
            calls[out.request_id] += out.tool_calls
            last[out.request_id] = out
        return [
            RequestOutput(
                r,
                tuple(tokens[r]),
                "".join(text[r]),
                True,
                last[r].finish_reason,
                last[r].num_prompt_tokens,
                last[r].num_output_tokens,
                last[r].error,
                tuple(lps[r]),
                prompt_lps[r],
                tuple(calls[r]),
            )
            for r in order
        ]

    # -- helpers -----------------------------------------------------------------------------

    def _check_token_ids(self, params: SamplingParams) -> None:
        """Token ids a request names must be the model's (logit_bias and min_tokens index the
        logits by them)."""
        vocab = self.runner.model.config.vocab_size
        for name, ids in (
            ("logit_bias", [t for t, _ in params.logit_bias]),
            ("stop_token_ids", params.stop_token_ids),
        ):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise InvalidRequestError(
                    name, f"ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})"
                )

    def _named(self, logprobs: TokenLogprobs) -> OutputLogprobs:
        def entry(token_id: int, logprob: float) -> LogprobEntry:
            text = self.tokenizer.decode([token_id])  # as the text is: special tokens are ""
            return LogprobEntry(token_id, text, logprob)

        return OutputLogprobs(
            entry(logprobs.token_id, logprobs.logprob),
            tuple(entry(t, lp) for t, lp in logprobs.top),
        )

    def _prompt_ids(self, prompt: str | Seq[int] | Conversation, chat: bool) -> list[int]:
        if isinstance(prompt, Conversation):
            return self.tokenizer.encode(prompt.render(self.tokenizer))
        if len(prompt) == 0:
            raise InvalidRequestError("prompt", "must not be empty (or give prompt_token_ids)")
        if not isinstance(prompt, str):
            if chat:
                raise InvalidRequestError("chat", "applies to a text prompt, not to token ids")
            self._check_prompt_fits("prompt_token_ids", len(prompt))
            vocab = self.runner.model.config.vocab_size
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise InvalidRequestError(
                    "prompt_token_ids", f"ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})"
                )
            return list(prompt)
        try:
            utf8 = prompt.encode("utf-8")
        except UnicodeEncodeError as error:
            raise InvalidRequestError(
                "prompt", f"is not valid Unicode text (character {error.start})"
            ) from None
        # NOTE: cheap first: a prompt too long for max_model_len is refused before tokenizing.
        self._check_prompt_fits("prompt", self.tokenizer.min_num_tokens(utf8), at_least=True)
        if chat:
            prompt = Conversation.user(prompt).render(self.tokenizer, field="chat")
        return self._encode(prompt, "prompt")

    def _encode(self, text: str, field: str) -> list[int]:
        prompt_ids = self.tokenizer.encode(text)
        if not prompt_ids:
            raise InvalidRequestError(
                field, "makes no tokens (this tokenizer drops every character in it)"
            )
        self._check_prompt_fits(field, len(prompt_ids))
        return prompt_ids

    def _check_prompt_fits(self, field: str, num_tokens: int, at_least: bool = False) -> None:
        if num_tokens >= self.max_model_len:
            raise InvalidRequestError(
                field,
                f"has {'at least ' * at_least}{num_tokens} tokens; at most "
                f"{self.max_model_len - 1} fit max_model_len={self.max_model_len}",
            )

    def _stop_reason(
        self, seq_id: str, token_id: int, grammar_complete: bool
    ) -> FinishReason | None:
        """Whether `token_id`, just sampled, ends its request: a stop string now complete in the
        text, a stop token id, EOS, or the end of its grammar (structured outputs). (Length
        limits are the scheduler's to apply.)"""
        state = self._requests.get(seq_id)
        if state is None:  # aborted since the step was scheduled
            return None
        params = state.params
        if state.on_token(token_id):
            return FinishReason.STOP
        if token_id in params.stop_token_ids:
            return FinishReason.STOP
        if not params.ignore_eos and token_id in self.tokenizer.eos_token_ids:
            return FinishReason.STOP
        if grammar_complete:
            return FinishReason.STOP
        return None

    def _output(self, seq_id: str, finished: bool) -> RequestOutput:
        seq, state = self._seqs[seq_id], self._requests[seq_id]
        new_ids = tuple(seq.output_token_ids[state.num_emitted_tokens :])
        logprobs = tuple(state.logprobs[state.num_emitted_tokens :])
        first = state.num_emitted_tokens == 0
        state.num_emitted_tokens = seq.num_output_tokens
        text, tool_calls = state.take_text(finished)
        reason = seq.finish_reason if finished else None
        if reason is FinishReason.STOP and state.called_tools:
            reason = FinishReason.TOOL_CALLS
        return RequestOutput(
            request_id=seq_id,
            new_token_ids=new_ids,
            new_text=text,
            finished=finished,
            finish_reason=reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            logprobs=logprobs,
            prompt_logprobs=self._prompt_logprobs(seq, state) if first else (),
            tool_calls=tool_calls,
            index=state.index,
        )

    def _prompt_logprobs(self, seq: Sequence, state: RequestState) -> tuple[OutputLogprobs, ...]:
        """Every prompt token's score (the first's logprob None), when the request asked."""
        if seq.params.prompt_logprobs is None:
            return ()
        first_id = seq.prompt_token_ids[0]
        head = OutputLogprobs(LogprobEntry(first_id, self.tokenizer.decode([first_id]), None), ())
        scores = state.prompt_scores
        return (head, *(self._named(scores[p]) for p in range(1, seq.num_prompt_tokens)))

    def _fail(self, seq_id: str, cause: str) -> RequestOutput | None:
        """End one request that failed alone: its KV is freed, its last output says why."""
        seq, state = self._seqs.get(seq_id), self._requests.get(seq_id)
        if seq is None or not self.scheduler.abort(seq_id, FinishReason.ERROR):
            return None  # aborted since the step was scheduled
        log.error("request %s failed: %s", seq_id, cause)
        self._forget(seq_id)
        return RequestOutput(
            request_id=seq_id,
            new_token_ids=(),
            new_text="",
            finished=True,
            finish_reason=FinishReason.ERROR,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            error=cause,
            index=state.index,
        )

    def _forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
        self._seqs.pop(request_id, None)
        self.runner.forget(request_id)
