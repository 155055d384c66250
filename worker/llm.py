"""The short front door for embedding the engine, in the manner of `vllm.LLM`.

    from intentserve import LLM, SamplingParams

    llm = LLM(model="smollm2-135m", paged_attention="on")
    for out in llm.generate(["The capital of France is"], SamplingParams(max_tokens=16)):
        print(out.text)
    print(llm.realized.describe())

`LLM` is a thin shell over `EngineBuilder`: it parses its arguments once, builds the engine and
runs prompts to completion. `llm.engine` gives token-level control (`add_request`, `step`,
`abort`, `stream`). An explicit `paged_attention="on"` is a requirement, as in the manifest:
where the paged KV cache cannot be realized, construction raises `PagedAttentionRequiredError`
naming the setting and the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from intentserve.policy import PagedAttentionMode, WeightFormat, parse_kv_memory
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.chat import Conversation, Tool
from intentserve.worker.engine.engine import Engine
from intentserve.worker.engine.realized import RealizedReport
from intentserve.worker.engine.request import RequestOutput
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.engine.tool_calls import ToolCall
from intentserve.worker.sched.sequence import FinishReason

Prompt = str | Sequence[int] | Conversation


@dataclass(frozen=True)
class Completion:
    """What one prompt produced, run to completion."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int
    error: str = ""  # why it failed, when finish_reason is ERROR (its batch mates are unaffected)
    tool_calls: tuple[ToolCall, ...] = ()  # a chat with tools: the calls parsed out of the text

    @classmethod
    def of(cls, out: RequestOutput) -> Completion:
        """From the combined output `Engine.generate` returns for one prompt."""
        return cls(
            text=out.new_text,
            token_ids=out.new_token_ids,
            finish_reason=out.finish_reason,
            num_prompt_tokens=out.num_prompt_tokens,
            num_output_tokens=out.num_output_tokens,
            error=out.error,
            tool_calls=out.tool_calls,
        )


class LLM:
    """A loaded model with its engine; `generate` and `chat` run prompts to completion."""

    def __init__(
        self,
        model: str = "smollm2-135m",
        *,
        paged_attention: PagedAttentionMode | str = "auto",
        dtype: str = "auto",
        device: str = "cpu",
        kv_cache_memory: int | str | None = None,
        max_num_seqs: int | None = None,
        max_model_len: int | None = None,
        max_num_batched_tokens: int | None = None,
        weights: WeightFormat | str = "auto",
        chat_template: str | None = None,
        **paged_attention_options,
    ) -> None:
        """`kv_cache_memory`: bytes (268435456, "256Mi", "1Gi") or a share of free device memory
        ("10%"); default: the engine's share. `weights`: auto, dequantized, int8 or int4 (an
        explicit format this machine cannot hold is an error). `chat_template`: a Jinja chat
        template's text, in place of the checkpoint's (for one with none).
        `paged_attention_options`: block_size, prefix_caching, backend, kv_cache_dtype. Errors
        name the argument at fault."""
        budget = parse_kv_memory(kv_cache_memory)
        builder = (
            EngineBuilder()
            .model(model)
            .dtype(dtype)
            .device(device)
            .weights(weights)
            .chat_template(chat_template)
            .paged_attention(paged_attention, **paged_attention_options)
            .kv_cache_memory(bytes=budget.num_bytes, fraction=budget.fraction)
            .scheduler(
                max_num_seqs=max_num_seqs,
                max_model_len=max_model_len,
                max_num_batched_tokens=max_num_batched_tokens,
            )
        )
        self.engine: Engine = builder.build()

    @property
    def realized(self) -> RealizedReport:
        """What the engine really built (cache kind, backend, budget, fallback reasons)."""
        return self.engine.realized

    def generate(
        self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | None = None
    ) -> list[Completion]:
        """One completion per prompt, in order. A prompt is text or a list of token ids; a
        single prompt may be given bare. Nothing runs when a prompt cannot be served
        (InvalidRequestError names the field)."""
        if isinstance(prompts, str) or (prompts and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        return [Completion.of(out) for out in self.engine.generate(prompts, params)]

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        params: SamplingParams | None = None,
        tools: Sequence[Tool] = (),
    ) -> Completion:
        """The assistant's reply to one conversation ({"role", "content"} dicts; roles system,
        user, assistant and tool: see `Conversation.of`), rendered through the model's chat
        template; with `tools` the template lists them and the reply's calls are parsed
        (`Completion.tool_calls`, finish_reason TOOL_CALLS)."""
        return self.generate([Conversation.of(messages, tools)], params)[0]
