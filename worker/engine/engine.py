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

Checking and tokenizing a request is `prepare.py`'s (RequestPreparer), off the engine's thread.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator
from collections.abc import Sequence as Seq

from intentserve.common.choices import choice_id, choice_seed
from intentserve.worker.engine.chat import Conversation
from intentserve.worker.engine.grammar import GrammarCompiler
from intentserve.worker.engine.prepare import RequestPreparer
from intentserve.worker.engine.realized import RealizedReport
from intentserve.worker.engine.reasoning import ReasoningSplitter, ThinkingBudget
from intentserve.worker.engine.request import (
    LogprobEntry,
    OutputLogprobs,
    PreparedRequest,
    RequestOutput,
    RequestState,
    joined,
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
        self.grammars = grammars  # the runner's sampler's too: requests are compiled when prepared
        self.scheduler = scheduler
        self.runner = runner
        self.realized = realized
        self.max_model_len = max_model_len
        # A thinking model's markers, or None (an engine put together without a report: none).
        self.reasoning = realized.cache.reasoning if realized is not None else None
        self._preparer = RequestPreparer(
            tokenizer,
            grammars,
            max_model_len=max_model_len,
            vocab_size=runner.model.config.vocab_size,
            reasoning=self.reasoning,
        )
        # What a thinking budget writes when it is spent: the end marker's tokens.
        self._end_ids = (
            tuple(tokenizer.encode(self.reasoning.end, add_bos=False)) if self.reasoning else ()
        )
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
        """Check and tokenize a request (`RequestPreparer.prepare`); any thread may call it."""
        return self._preparer.prepare(prompt, params, request_id, chat=chat)

    def tokenize(self, prompt: str | Conversation, add_bos: bool | None = None) -> list[int]:
        """`RequestPreparer.tokenize`; any thread may call it."""
        return self._preparer.tokenize(prompt, add_bos)

    def detokenize(self, token_ids: Seq[int]) -> str:
        """`RequestPreparer.detokenize`; any thread may call it."""
        return self._preparer.detokenize(token_ids)

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
        self._queue(first, request, 0)
        for i, request_id in enumerate(ids[1:], start=1):
            params = request.params
            if params.seed is not None:
                params = dataclasses.replace(params, seed=choice_seed(params.seed, i))
            if first.reuses_prefix_cache:
                seq = first.fork(request_id, params)
            else:
                seq = alone(request_id, params)
            self._queue(seq, request, i)
        return ids

    def check_num_choices(self, n: int) -> None:
        """InvalidRequestError naming `n` unless 1 <= n <= max_num_seqs (every choice must be
        able to run at once); any thread may call it (a server checks before taking slots)."""
        limit = self.scheduler.max_num_seqs
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= limit:
            raise InvalidRequestError(
                "n", f"{n!r} choices; allowed: 1 to {limit} (this worker's maxNumSeqs)"
            )

    def _queue(self, seq: Sequence, request: PreparedRequest, index: int) -> None:
        request_id = seq.seq_id
        self.scheduler.add(seq)
        decoder = IncrementalDecoder(self.tokenizer, list(seq.prompt_token_ids))
        parser = ToolCallParser() if request.parses_tool_calls else None
        phase, splitter, budget = request.reasoning_phase, None, None
        if phase is not None and self.reasoning is not None:
            splitter = ReasoningSplitter(self.reasoning, phase)
            # NOTE: without a budget it only counts the thinking's tokens (usage reports them).
            budget = ThinkingBudget(
                self.reasoning, phase, seq.params.reasoning_budget, self._end_ids
            )
        self._requests[request_id] = RequestState(
            request_id, seq.params, decoder, parser, index, splitter, budget
        )
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
        tokens = {s: self._forced(s, t) for s, t in samples.tokens.items()}
        for seq_id, token_id in tokens.items():
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
        sampled = {s: t for s, t in tokens.items() if s not in failures}
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
        deltas: dict[str, list[RequestOutput]] = {r: [] for r in order}
        for out in self.stream():
            deltas[out.request_id].append(out)
        return [joined(deltas[r]) for r in order]

    # -- helpers -----------------------------------------------------------------------------

    def _named(self, logprobs: TokenLogprobs) -> OutputLogprobs:
        def entry(token_id: int, logprob: float) -> LogprobEntry:
            text = self.tokenizer.decode([token_id])  # as the text is: special tokens are ""
            return LogprobEntry(token_id, text, logprob)

        return OutputLogprobs(
            entry(logprobs.token_id, logprobs.logprob),
            tuple(entry(t, lp) for t, lp in logprobs.top),
        )

    def _forced(self, seq_id: str, token_id: int) -> int:
        """The token `seq_id` produces this step: the one sampled, or, where its thinking budget
        is spent, the end marker's next token in its place."""
        state = self._requests.get(seq_id)
        if state is None or state.budget is None:
            return token_id
        forced = state.budget.forced()
        return token_id if forced is None else forced

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
        reasoning, text, tool_calls = state.take_text(finished)
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
            stop_string=state.stop_string if reason is FinishReason.STOP else "",
            new_reasoning=reasoning,
            num_reasoning_tokens=state.budget.num_tokens if state.budget is not None else 0,
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
