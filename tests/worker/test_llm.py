"""The `LLM` front door: the same tokens as the engine it builds, the policy enforced as in the
manifest (an explicit `on` refused where it cannot be realized), and errors naming the argument."""

import pytest
from intentserve import LLM, SamplingParams
from intentserve.policy import CacheKind, IntentError, PagedAttentionRequiredError, ReasonCode
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.chat import Tool
from intentserve.worker.engine.sampling import InvalidRequestError
from intentserve.worker.sched.sequence import FinishReason

from tests.import_checks import parts_loaded_by

pytestmark = pytest.mark.model

MIB = 1 << 20
# 16 MiB: a 256-token sequence in float32 (what `dtype: auto` gives without avx512_bf16), 11.25 MiB.
KV_BYTES = 16 * MIB
SMALL = {"kv_cache_memory": "16Mi", "max_model_len": 256}
PROMPTS = ["The capital of France is", "Water boils at"]
GREEDY = SamplingParams(max_tokens=8)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("smollm2-135m", paged_attention="on", **SMALL)


def test_importing_intentserve_loads_no_torch():
    assert parts_loaded_by(["intentserve"], {"torch"}) == []


def test_generate_gives_the_engine_builders_tokens(llm):
    engine = (
        EngineBuilder()
        .model("smollm2-135m")
        .paged_attention("on")
        .kv_cache_memory(bytes=KV_BYTES)
        .scheduler(max_model_len=256)
        .build()
    )
    expected = engine.generate(PROMPTS, GREEDY)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [(o.text, o.token_ids) for o in outs] == [
        (e.new_text, e.new_token_ids) for e in expected
    ]
    assert all(o.text and o.num_output_tokens == len(o.token_ids) <= 8 for o in outs)
    assert [o.num_prompt_tokens for o in outs] == [e.num_prompt_tokens for e in expected]


def test_a_bare_prompt_and_token_ids(llm):
    [by_text] = llm.generate(PROMPTS[0], GREEDY)
    ids = llm.engine.tokenizer.encode(PROMPTS[0])
    [by_ids] = llm.generate(ids, GREEDY)
    assert by_text == by_ids
    assert llm.generate([ids], GREEDY) == [by_ids]


def test_a_prompt_that_cannot_be_served_runs_nothing(llm):
    with pytest.raises(InvalidRequestError, match="^prompt: must not be empty"):
        llm.generate([PROMPTS[0], ""], GREEDY)
    assert not llm.engine.has_unfinished
    assert llm.generate(PROMPTS, GREEDY)[0].text


def test_on_realizes_a_paged_cache_within_the_budget(llm):
    cache = llm.realized.cache
    assert cache.kind is CacheKind.PAGED and 0 < cache.kv_cache_bytes <= KV_BYTES
    assert "cache paged" in llm.realized.describe()


def test_off_realizes_a_contiguous_cache():
    off = LLM(paged_attention="off", **SMALL)
    assert off.realized.cache.kind is CacheKind.CONTIGUOUS
    assert off.realized.cache.fallback_reasons == ()


def test_on_for_a_model_without_kv_cache_refuses_naming_setting_and_reason():
    with pytest.raises(PagedAttentionRequiredError) as err:
        LLM("minilm-l6", paged_attention="on")
    assert err.value.setting == "paged_attention: on"
    assert err.value.reason.code is ReasonCode.MODEL_HAS_NO_KV_CACHE
    assert str(err.value) == (
        "PagedAttention was explicitly requested (paged_attention: on), but "
        f"{err.value.reason.message}"
    )
    assert "has no KV cache" in err.value.reason.message


def test_chat_answers_through_the_template(llm):
    reply = llm.chat([{"role": "user", "content": "What is 2+2?"}], SamplingParams(max_tokens=12))
    assert reply.text.strip() and reply.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    with pytest.raises(InvalidRequestError, match="^messages: "):
        llm.chat([{"content": "no role"}])
    # SmolLM2's own template never reads `tools`: they are refused, not dropped.
    with pytest.raises(InvalidRequestError, match="^tools: "):
        llm.chat([{"role": "user", "content": "Weather?"}], tools=[Tool("get_weather")])


@pytest.mark.parametrize(
    ("kwargs", "error", "field"),
    [
        ({"paged_attention": "sometimes"}, IntentError, "paged_attention"),
        ({"kv_cache_memory": "lots"}, IntentError, "kv_cache_memory"),
        ({"block_size": 0}, IntentError, "block_size"),
        ({"prefix_caching": "maybe"}, IntentError, "prefix_caching"),
        ({"max_num_seqs": 0}, ValueError, "max_num_seqs"),
        ({"kv_cache_bytes": 1 << 20}, IntentError, "^kv_cache_bytes: the KV budget is set with"),
        ({"blocksize": 8}, IntentError, "^blocksize: unknown option"),
    ],
)
def test_bad_arguments_are_refused_naming_them_before_loading(kwargs, error, field):
    with pytest.raises(error, match=field):
        LLM("no-such-model", **kwargs)
