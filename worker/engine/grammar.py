"""Structured outputs through llguidance: a request's Constraint compiled against the model's
vocabulary, and each constrained request's matcher, which gives the tokens allowed next as a
bitmask and is advanced by the token drawn.

Why llguidance (docs/engine.md, "Structured outputs"): it installs as one 3 MB wheel with no
dependencies and reads the `tokenizers` JSON the GGUF tokenizers are built as; xgrammar needs
transformers, triton and apache-tvm-ffi at run time. Both compute a JSON-schema mask in tens of
microseconds on SmolLM2's vocabulary, far below a decode step.

The vocabulary (an `LLTokenizer`, built from the tokenizer: 0.4 s for SmolLM2, 2.6 s for Gemma
3's 262k tokens) is built once per tokenizer and process. NOTE: llguidance builds it in one call
that holds the GIL throughout, so no other thread of the process runs meanwhile: a worker's
heartbeat thread among them, and a 2.6-3.9 s silence at a first constrained request lost a
Gemma worker to the controller's 5 s heartbeat timeout on a loaded host. A worker therefore
builds it before it registers (`prebuild_vocabulary`, lifecycle.py), while nothing watches its
heartbeats; the compiler finds it here by the tokenizer's content. Compiled grammars are kept
in a bounded LRU cache keyed by the constraint, and each request gets its own copy.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence

import llguidance
import numpy as np
import torch
from intentserve.worker.engine.constraint import (
    FIELD,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    Constraint,
    ConstraintKind,
)
from intentserve.worker.engine.sampling import InvalidRequestError
from intentserve.worker.model.tokenizer import Tokenizer
from torch import Tensor

MAX_CACHED_GRAMMARS = 256


def _grammar(constraint: Constraint) -> str:
    """The constraint as llguidance's grammar text."""
    kind = constraint.kind
    if kind == ConstraintKind.JSON_OBJECT:
        return llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}')
    if kind == ConstraintKind.JSON_SCHEMA:
        return llguidance.LLMatcher.grammar_from_json_schema(constraint.text)
    if kind == ConstraintKind.REGEX:
        return llguidance.LLMatcher.grammar_from_regex(constraint.text)
    if kind == ConstraintKind.GRAMMAR:
        # NOTE: "grammar" is Lark, or GBNF converted to Lark; a GBNF that does not convert is
        # ValueError, a Lark that does not compile an error of the matcher.
        return llguidance.grammar_from("grammar", constraint.text)
    if kind == ConstraintKind.CHOICE:
        return llguidance.LLMatcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(c) for c in constraint.choices)
        )
    open_tag, close_tag = json.dumps(TOOL_CALL_OPEN), json.dumps(TOOL_CALL_CLOSE)
    start = 'tool_call ("\\n" tool_call)*' if kind == ConstraintKind.TOOL_CALLS else "tool_call"
    return llguidance.LLMatcher.grammar_from_lark(
        f"start: {start}\ntool_call: {open_tag} call {close_tag}\ncall: %json {constraint.text}"
    )


# Vocabularies built in this process, by tokenizer content (`_vocabulary_key`).
_VOCABULARIES: dict[str, llguidance.LLTokenizer] = {}
_VOCABULARIES_LOCK = threading.Lock()


def _vocabulary_key(tokenizer: Tokenizer) -> str:
    digest = hashlib.sha256(tokenizer.backend.to_str().encode())
    digest.update(f"{tokenizer.vocab_size}:{list(tokenizer.eos_token_ids)}".encode())
    return digest.hexdigest()


def _build_vocabulary(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """ValueError when llguidance cannot read the tokenizer."""
    key = _vocabulary_key(tokenizer)
    with _VOCABULARIES_LOCK:
        vocabulary = _VOCABULARIES.get(key)
        if vocabulary is None:
            vocabulary = llguidance.LLTokenizer(
                tokenizer.backend.to_str(),
                n_vocab=tokenizer.vocab_size,
                eos_token=list(tokenizer.eos_token_ids),
            )
            _VOCABULARIES[key] = vocabulary
        return vocabulary


def prebuild_vocabulary(tokenizer: Tokenizer) -> str:
    """Build `tokenizer`'s grammar vocabulary now, so that no constrained request builds it;
    what happened, in words (a tokenizer llguidance cannot read is said, and refused later by
    each constrained request)."""
    began = time.monotonic()
    try:
        _build_vocabulary(tokenizer)
    except ValueError as error:
        return f"the grammar engine cannot read this tokenizer ({_first_line(str(error))})"
    seconds = time.monotonic() - began
    return f"grammar vocabulary of {tokenizer.vocab_size} tokens built in {seconds:.1f} s"


class GrammarCompiler:
    """One model's constraints -> matchers. Thread-safe: requests are checked (compiled) off the
    engine loop's thread and matched on it."""

    def __init__(self, tokenizer: Tokenizer, max_cached: int = MAX_CACHED_GRAMMARS) -> None:
        self._tokenizer = tokenizer
        self._max_cached = max_cached
        self._vocabulary: llguidance.LLTokenizer | None = None
        self._unreadable: str | None = None  # why the tokenizer cannot be used, once known
        self._compiled: OrderedDict[Constraint, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()  # the cache's
        self._vocabulary_lock = threading.Lock()  # the vocabulary is built once
        self.executor = llguidance.LLExecutor()
        self.num_compiles = 0  # grammars compiled into the cache (misses that compiled)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.vocab_size

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        # NOTE: a tokenizer llguidance cannot read is refused once, then on every constrained
        # request alike (the reason is kept).
        with self._vocabulary_lock:
            if self._vocabulary is None and self._unreadable is None:
                try:
                    self._vocabulary = _build_vocabulary(self._tokenizer)
                except ValueError as error:
                    self._unreadable = (
                        f"this model's tokenizer cannot be read by the grammar engine: {error}"
                    )
        if self._vocabulary is None:
            raise InvalidRequestError(FIELD, self._unreadable)
        return self._vocabulary

    def compile(self, constraint: Constraint) -> None:
        """Check that this model can follow `constraint` (compiling it into the cache);
        InvalidRequestError names `constraint.<kind>` and the problem."""
        self.matcher(constraint)

    def matcher(self, constraint: Constraint) -> llguidance.LLMatcher:
        """A fresh matcher for one request (its own copy of the cached grammar).

        NOTE: the compile runs outside the cache's lock, so that the engine loop's cache hits
        never wait on a request being checked on another thread (a grammar can take a second)."""
        with self._lock:
            template = self._compiled.get(constraint)
            if template is not None:
                self._compiled.move_to_end(constraint)
                return template.deep_copy()
        template = self._compile(constraint)
        with self._lock:
            self.num_compiles += 1
            self._compiled[constraint] = template
            self._compiled.move_to_end(constraint)
            if len(self._compiled) > self._max_cached:
                self._compiled.popitem(last=False)
        return template.deep_copy()

    def _compile(self, constraint: Constraint) -> llguidance.LLMatcher:
        where = f"{FIELD}.{constraint.kind.value}"
        try:
            text = _grammar(constraint)
        except ValueError as error:
            raise InvalidRequestError(where, _first_line(str(error))) from None
        matcher = llguidance.LLMatcher(self._llg_tokenizer(), text, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(where, _first_line(matcher.get_error()))
        # NOTE: a grammar no token can begin leaves the matcher in error once asked for a mask.
        allowed = _allowed(matcher, self.vocab_size)
        if matcher.is_error() or not (matcher.is_accepting() or allowed.any()):
            raise InvalidRequestError(
                where, "no token of this model's vocabulary can begin an output that matches it"
            )
        return matcher


def _first_line(error: str) -> str:
    """llguidance's error in one line: its first, with the cause where it gives one below."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    if not lines:
        return "the grammar does not compile"
    causes = [
        line.removeprefix("error:").strip() for line in lines[1:] if line.startswith("error:")
    ]
    return " ".join([lines[0], *causes])[:500]


def _allowed(matcher: llguidance.LLMatcher, vocab_size: int) -> np.ndarray:
    """[vocab_size] bool: the tokens `matcher` allows next."""
    bits = np.unpackbits(
        np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little"
    )
    return bits[:vocab_size].astype(bool)


class GrammarRows:
    """Each constrained request's matcher, keyed by sequence id, advanced only by its own tokens.

    Used by the sampler alone (the engine loop's thread)."""

    def __init__(self, compiler: GrammarCompiler) -> None:
        self.compiler = compiler
        self._matchers: dict[str, llguidance.LLMatcher] = {}

    def forget(self, seq_id: str) -> None:
        self._matchers.pop(seq_id, None)

    def mask(
        self, logits: Tensor, rows: Sequence[int], seq_ids: Sequence[str], constraints
    ) -> dict[str, str]:
        """Set to -inf, in place, the logits [N, vocab] of each of `rows` that its grammar does
        not allow next (`seq_ids` and `constraints` are the rows'); the rows that could not be
        masked, with why. Other rows are left as they are.

        NOTE: no row is copied out and back: on this CPU, index_select of 32 rows of 49,152
        logits took 40-85 ms a step under load; the mask is applied in place over all N rows,
        the unconstrained ones allowing everything."""
        failures: dict[str, str] = {}
        matchers = []
        for row, seq_id, constraint in zip(rows, seq_ids, constraints, strict=True):
            matcher = self._matchers.get(seq_id)
            if matcher is None:
                try:
                    matcher = self._matchers[seq_id] = self.compiler.matcher(constraint)
                except InvalidRequestError as error:
                    failures[seq_id] = str(error)
                    continue
            matchers.append((matcher, row))
        num_rows, vocab = logits.shape
        num_words = (self.compiler.vocab_size + 31) // 32
        bitmask = torch.full((num_rows, num_words), -1, dtype=torch.int32)  # [N, words]
        bitmask[list(rows)] = 0  # a row whose matcher is missing allows nothing
        if matchers:
            self.compiler.executor.unsafe_compute_mask_ptr(
                matchers, bitmask.data_ptr(), num_words * 4, num_rows
            )
        width = min(vocab, self.compiler.vocab_size)
        # NOTE: the bits inverted while packed (N x vocab/8 bytes), then unpacked straight into
        # bytes that are 0 or 1, i.e. bools: no pass over [N, vocab] but the fill itself.
        refused_bits = np.unpackbits(
            np.invert(bitmask.numpy().view(np.uint8)), axis=1, bitorder="little"
        )
        refused = torch.from_numpy(refused_bits[:, :width]).view(torch.bool)  # [N, width]
        logits[:, :width].masked_fill_(refused.to(logits.device), float("-inf"))
        if width < vocab:  # past the tokenizer's vocabulary (padding): never allowed
            logits[list(rows), width:] = float("-inf")
        for matcher, row in matchers:
            if matcher.is_error():
                failures[seq_ids[rows.index(row)]] = f"{FIELD}: {_first_line(matcher.get_error())}"
        empty = (bitmask == 0).all(dim=1).tolist()  # NOTE: bits past the vocabulary are 0
        for row, seq_id in zip(rows, seq_ids, strict=True):
            if empty[row] and seq_id not in failures:
                failures[seq_id] = f"{FIELD}: the grammar allows no next token"
        return failures

    def advance(self, tokens: dict[str, int]) -> tuple[set[str], dict[str, str]]:
        """Feed each row its drawn token; the rows whose grammar is now complete, and those
        whose token the grammar refused (with why)."""
        complete, failures = set(), {}
        for seq_id, token in tokens.items():
            matcher = self._matchers[seq_id]
            try:
                consumed = matcher.consume_token(token)
            except Exception as error:  # NOTE: this request's failure, not its batch's
                failures[seq_id] = f"{FIELD}: {type(error).__name__}: {error}"
                continue
            if not consumed:
                failures[seq_id] = f"{FIELD}: {_first_line(matcher.get_error())}"
            elif matcher.is_stopped():
                complete.add(seq_id)
        return complete, failures
