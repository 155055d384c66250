"""`chat_template` (the SDK's, `spec.model.chatTemplate` on a worker): the engine renders
conversations through it in place of the checkpoint's, leaving the loaded model's own untouched;
one that does not compile is refused naming it."""

from __future__ import annotations

import pytest
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.chat import Conversation

TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] "


def _engine(tiny_loaded, template):
    return (
        EngineBuilder()
        .paged_attention("on")
        .kv_cache_memory(bytes=1 << 20)
        .scheduler(max_model_len=128)
        .chat_template(template)
        .build(loaded=tiny_loaded)
    )


def test_the_engine_renders_through_the_given_template(tiny_loaded):
    own = tiny_loaded.tokenizer.chat_template
    engine = _engine(tiny_loaded, TEMPLATE)
    prompt = Conversation.user("hello").render(engine.tokenizer)
    assert prompt == "[user] hello\n[assistant] "
    assert tiny_loaded.tokenizer.chat_template == own != TEMPLATE
    assert _engine(tiny_loaded, None).tokenizer.chat_template == own


def test_a_template_that_does_not_compile_is_refused_naming_it():
    with pytest.raises(ValueError, match="^chat_template: chat template does not compile"):
        EngineBuilder().chat_template("{% if x %}")
