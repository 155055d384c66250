"""Next-token choice for a batch of rows: greedy rows by argmax, the rest by temperature, top-k,
top-p, min_p and an optional per-request seed (a request's draws do not depend on its batch
mates), after the changes a request asks for in its logits (logits_processing); and, for rows
that ask, the log-probabilities of the model's own distribution.

Batched tensor work: one argmax pass over every row; the rows that sample are drawn together
(an exponential race, `argmax(p / q)` with q ~ Exp(1), which draws from p); only the seeded rows
fill their q from their own generator, one call each.

Rows with a structured-output constraint have the tokens their grammar does not allow set to
-inf (one bitmask per step for all of them, grammar.py), with the other changes; the token drawn
then advances the row's grammar, and a grammar now complete is reported in
`StepSamples.complete` (the engine ends the request there).

A row that cannot be sampled is that request's failure alone: it comes back as a value in
`StepSamples.failures` (logits that are not finite, an error while sampling, a grammar that
allows no token), and every other row is sampled as if it were not there.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from intentserve.worker.engine.grammar import GrammarCompiler, GrammarRows
from intentserve.worker.engine.logits_processing import TokenHistory, process_logits
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.kernels import KernelUnavailable, fused_ops
from torch import Tensor

log = logging.getLogger(__name__)


@functools.cache
def _compiled_max_argmax():
    """fused_ops.c's row-wise (maximum, argmax), or None where the library cannot be built."""
    try:
        return fused_ops().max_argmax_rows_f32
    except KernelUnavailable as exc:
        log.info("the sampler's argmax stays in torch ops: %s", exc.reason)
        return None


@dataclass(frozen=True)
class TokenLogprobs:
    """A sampled token's log-probability and the likeliest tokens' (most likely first), of the
    model's distribution before any penalty, bias or temperature."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class StepSamples:
    """One step's sampling: a token for each row that could be sampled, and for each that could
    not, why (a sentence that names the stage); logprobs for the rows that asked."""

    tokens: dict[str, int]
    failures: dict[str, str]
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    # The runner's, for the rows that asked: {seq_id: {prompt position: its token's score}}.
    prompt_logprobs: dict[str, dict[int, TokenLogprobs]] = field(default_factory=dict)
    complete: frozenset[str] = frozenset()  # rows whose grammar the token just drawn completed


def argmax_rows(logits: Tensor, chunk: int = 1024) -> Tensor:
    """Row-wise argmax of [N, vocab], exactly as `logits.argmax(-1)` (ties and NaN go to the
    lowest index)."""
    return max_and_argmax_rows(logits, chunk)[1]


def max_and_argmax_rows(
    logits: Tensor, chunk: int = 1024, *, compiled: bool = True
) -> tuple[Tensor, Tensor]:
    """Row-wise (maximum, argmax) of [N, vocab], exactly as `logits.amax(-1)` (NaN where a row
    holds one) and `logits.argmax(-1)` (ties and NaN go to the lowest index), from one read of
    the logits. On the CPU in float32: fused_ops.c's `max_argmax_rows_f32` (`compiled=False`
    leaves it out, for comparisons); else torch ops: the maximum of each chunk of `chunk`
    columns, then the argmax inside the first chunk holding the row's maximum.

    NOTE: on this 2-core CPU, torch's argmax over [32, 49152] float32 took 1.1 ms per step;
    `amax` vectorizes and the two passes take 0.12 ms. The sampler's check for non-finite rows
    reads the row maxima from here, not from a pass of its own over the logits.
    """
    num_rows, vocab = logits.shape
    on_cpu = logits.device.type == "cpu" and logits.is_contiguous()
    if compiled and on_cpu and logits.dtype == torch.float32 and 16 <= vocab < 2**31:
        kernel = _compiled_max_argmax()
        if kernel is not None:
            row_max = torch.empty(num_rows, dtype=torch.float32)
            index = torch.empty(num_rows, dtype=torch.int64)
            kernel(logits.data_ptr(), num_rows, vocab, row_max.data_ptr(), index.data_ptr())
            return row_max, index
    if not on_cpu or vocab < 4 * chunk:
        return logits.amax(dim=-1), logits.argmax(dim=-1)
    full = vocab // chunk * chunk
    head = logits[:, :full].view(num_rows, full // chunk, chunk)
    maxima = head.amax(dim=-1)  # [N, chunks]; NaN where a chunk holds one
    best = maxima.argmax(dim=-1)  # the first chunk with the maximum (or the first NaN)
    index = best * chunk + head[torch.arange(num_rows), best].argmax(dim=-1)
    row_max = maxima.gather(1, best[:, None])[:, 0]
    if full < vocab:
        tail_max, tail_index = logits[:, full:].max(dim=-1)
        tail_wins = (tail_max > row_max) | (tail_max.isnan() & ~row_max.isnan())
        index = torch.where(tail_wins, tail_index + full, index)
        row_max = torch.where(tail_wins, tail_max, row_max)
    return row_max, index


class Sampler:
    def __init__(
        self, eos_token_ids: Sequence[int] = (), grammars: GrammarCompiler | None = None
    ) -> None:
        self.eos_token_ids = tuple(eos_token_ids)  # banned below a request's min_tokens
        # One generator per seeded request, advanced only by that request's own draws.
        self._generators: dict[str, torch.Generator] = {}
        # None: no model vocabulary to compile against (a sampler alone, in tests and benches);
        # a constrained row is then that request's failure.
        self._grammar_rows = None if grammars is None else GrammarRows(grammars)

    def forget(self, seq_id: str) -> None:
        self._generators.pop(seq_id, None)
        if self._grammar_rows is not None:
            self._grammar_rows.forget(seq_id)

    def _generator(self, seq_id: str, params: SamplingParams) -> torch.Generator:
        gen = self._generators.get(seq_id)
        if gen is None:
            gen = self._generators[seq_id] = torch.Generator().manual_seed(params.seed)
        return gen

    def sample(
        self,
        logits: Tensor,
        seq_ids: Sequence[str],
        params: Sequence[SamplingParams],
        histories: Sequence[TokenHistory] | None = None,
    ) -> StepSamples:
        """logits: [N, vocab] float32 on any device -> a token per row, or why not. `histories`
        (each row's tokens so far) are needed when a row asks for penalties or min_tokens.

        NOTE: the logits of the rows that ask for changes (logit_bias, penalties, min_tokens)
        are changed in place."""
        # NOTE: amax propagates NaN, so a row maximum that is not finite flags NaN, +inf, or a
        # row with no finite value; -inf entries alone are tokens that are never drawn.
        # NOTE: isfinite in Python, on the N maxima as floats: the step's first torch op after the
        # LM head's kernel (56 MB of weights streamed through the caches) took 40-100 us there.
        row_max, chosen = max_and_argmax_rows(logits)
        finite = [math.isfinite(m) for m in row_max.tolist()]
        failures = {
            seq_ids[row]: "logits: the model's logits for this request are not finite"
            for row in range(len(seq_ids))
            if not finite[row]
        }
        ok = [row for row in range(len(seq_ids)) if finite[row]]
        logprob_rows = [row for row in ok if params[row].logprobs is not None]
        # NOTE: of the model's distribution, so before the logits change below.
        log_probs = torch.log_softmax(logits[logprob_rows], dim=-1) if logprob_rows else None
        tokens = chosen.tolist()  # [N]
        changed = [row for row in ok if params[row].processes_logits]
        if changed:
            index = torch.tensor(changed, device=logits.device)
            sub = logits.index_select(0, index)  # [C, vocab]
            process_logits(
                sub,
                [params[r] for r in changed],
                [histories[r] for r in changed],
                self.eos_token_ids,
            )
            logits.index_copy_(0, index, sub)
            for row, token in zip(changed, sub.argmax(dim=-1).tolist(), strict=True):
                tokens[row] = token
        constrained = [row for row in ok if params[row].constraint is not None]
        if constrained:
            failures.update(self._mask_to_grammars(logits, constrained, seq_ids, params))
            ok = [row for row in ok if seq_ids[row] not in failures]
            masked = max_and_argmax_rows(logits)[1].tolist()
            for row in constrained:
                tokens[row] = masked[row]
        drawn = [row for row in ok if not params[row].greedy]
        if drawn:
            try:
                draws, failed = self._draw(logits, drawn, [seq_ids[r] for r in drawn], params)
            except Exception as error:  # NOTE: these rows' failure, not the greedy rows'
                log.exception("sampling failed for requests %s", [seq_ids[r] for r in drawn])
                failures.update(
                    {seq_ids[r]: f"sampling: {type(error).__name__}: {error}" for r in drawn}
                )
                ok = [row for row in ok if params[row].greedy]
            else:
                for row, token in zip(drawn, draws, strict=True):
                    tokens[row] = token
                failures.update({seq_ids[drawn[i]]: why for i, why in failed.items()})
                ok = [row for row in ok if seq_ids[row] not in failures]
        complete: set[str] = set()
        drawn_under_grammar = {
            seq_ids[r]: tokens[r] for r in ok if params[r].constraint is not None
        }
        if drawn_under_grammar:
            complete, refused = self._grammar_rows.advance(drawn_under_grammar)
            failures.update(refused)
            ok = [row for row in ok if seq_ids[row] not in failures]
        samples = {seq_ids[row]: tokens[row] for row in ok}
        return StepSamples(
            samples,
            failures,
            self._logprobs(log_probs, logprob_rows, tokens, seq_ids, params, samples),
            complete=frozenset(complete),
        )

    def _mask_to_grammars(
        self, logits: Tensor, rows: list[int], seq_ids: Sequence[str], params
    ) -> dict[str, str]:
        """Mask, in place, the logits [N, vocab] of `rows` to each one's grammar; the rows that
        could not be masked, with why."""
        ids = [seq_ids[r] for r in rows]
        if self._grammar_rows is None:
            return {s: "constraint: this sampler has no model vocabulary to apply it" for s in ids}
        try:
            return self._grammar_rows.mask(logits, rows, ids, [params[r].constraint for r in rows])
        except Exception as error:  # NOTE: these rows' failure, not their batch's
            log.exception("the grammar mask failed for requests %s", ids)
            return {s: f"constraint: {type(error).__name__}: {error}" for s in ids}

    @staticmethod
    def _logprobs(log_probs, rows, tokens, seq_ids, params, samples) -> dict[str, TokenLogprobs]:
        if log_probs is None:
            return {}
        device = log_probs.device
        chosen = log_probs.gather(
            1, torch.tensor([tokens[r] for r in rows], device=device)[:, None]
        )
        num_top = max(params[r].logprobs for r in rows)
        top_values, top_ids = log_probs.topk(num_top, dim=-1) if num_top else (None, None)
        result = {}
        for i, row in enumerate(rows):
            if seq_ids[row] not in samples:
                continue
            k = params[row].logprobs
            top = ()
            if k:
                top = tuple(zip(top_ids[i, :k].tolist(), top_values[i, :k].tolist(), strict=True))
            result[seq_ids[row]] = TokenLogprobs(tokens[row], float(chosen[i, 0]), top)
        return result

    def _draw(
        self, logits: Tensor, rows: list[int], seq_ids: list[str], params: Sequence[SamplingParams]
    ) -> tuple[list[int], dict[int, str]]:
        """One draw per row of `rows` from finite logits, in float64 (which holds every float32
        exactly); and the rows (by position in `rows`) whose own draws failed, with why.

        The logits are shifted so that each row's best is 0 before dividing by the temperature:
        every scaled value is <= 0 and none overflows, whatever the (finite, positive)
        temperature. A temperature so small that every other token's exp() underflows draws
        among the best tokens only, i.e. it is greedy.
        """
        ps = [params[r] for r in rows]
        device = logits.device
        values = logits[rows].to(torch.float64)  # [R, vocab]
        vocab = values.shape[1]

        def column(name: str) -> Tensor:
            return torch.tensor([getattr(p, name) for p in ps], dtype=torch.float64, device=device)[
                :, None
            ]

        scaled = (values - values.amax(dim=-1, keepdim=True)) / column("temperature")
        top_ks = [min(p.top_k, vocab) if p.top_k else vocab for p in ps]
        if min(top_ks) < vocab:
            # On the unscaled values: scaling may round distinct logits to one value.
            num_top = max(k for k in top_ks if k < vocab)
            kth = values.topk(num_top, dim=-1).values  # [R, num_top]
            kth = kth.gather(
                1, torch.tensor([min(k, num_top) - 1 for k in top_ks], device=device)[:, None]
            )
            kth[torch.tensor([k == vocab for k in top_ks], device=device)] = float("-inf")
            scaled = scaled.masked_fill(values < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)  # [R, vocab]
        if any(p.top_p < 1.0 for p in ps):
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= column("top_p")
            probs = probs.scatter(1, order, sorted_probs.masked_fill(drop, 0.0))
        if any(p.min_p for p in ps):
            floor = column("min_p") * probs.amax(dim=-1, keepdim=True)
            probs = probs.masked_fill(probs < floor, 0.0)
        race = torch.empty_like(probs)
        unseeded = [i for i, p in enumerate(ps) if p.seed is None]
        if unseeded:
            race[unseeded] = torch.empty(
                len(unseeded), vocab, dtype=torch.float64, device=device
            ).exponential_()
        failed: dict[int, str] = {}
        for i, p in enumerate(ps):
            if p.seed is not None:
                try:
                    race[i] = self._seeded_noise(seq_ids[i], p, vocab)
                except Exception as error:  # NOTE: this request's failure, not its batch's
                    log.exception("sampling failed for request %s", seq_ids[i])
                    failed[i] = f"sampling: {type(error).__name__}: {error}"
                    race[i] = 1.0
        # NOTE: q = 0 would make 0 / 0 (NaN) win the argmax for a dropped token.
        race.clamp_(min=torch.finfo(torch.float64).tiny)
        return (probs / race).argmax(dim=-1).tolist(), failed

    def _seeded_noise(self, seq_id: str, params: SamplingParams, vocab: int) -> Tensor:
        """A seeded request's Exp(1) draws [vocab], from its own generator alone."""
        return torch.empty(vocab, dtype=torch.float64).exponential_(
            generator=self._generator(seq_id, params)
        )
