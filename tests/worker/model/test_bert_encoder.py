"""worker.model.bert against sentence-transformers on the packaged MiniLM-L6 (all-MiniLM-L6-v2):
the same token ids and vectors, vectors independent of their batch, long and empty inputs
refused, and folders it cannot reproduce refused at load by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from intentserve.worker.model import bert
from intentserve.worker.model.bert import Encoder, InputTooLong
from intentserve.worker.model.registry import resolve_model_path
from safetensors.torch import load_file, save_file

pytestmark = pytest.mark.model

_LONG = (
    "The committee met on Tuesday to review the quarterly budget, and after a lengthy "
    "discussion about travel expenses, software licences and the new office lease, it agreed "
    "to postpone the decision until the auditors had finished their report. "
)
TEXTS = [
    "hi",
    "Hello, world!",
    "What is the capital of France?",
    "A quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Ünïcödé: naïve café, Straße, 東京タワー, Ελληνικά, русский текст.",
    "I love pizza 🍕🔥 and coffee ☕️ on Mondays 😅",
    "   leading and trailing whitespace   ",
    "Numbers 3.14159, 2,718 and 1e-12; e-mail: someone@example.com; URL https://example.org/a?b=c",
    _LONG,
    _LONG * 2,
    _LONG * 4,  # about 200 tokens
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
]

_LEGACY_KEYS = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens"}


@pytest.fixture(scope="module")
def folder() -> Path:
    return resolve_model_path("minilm-l6")


@pytest.fixture(scope="module")
def encoder(folder: Path) -> Encoder:
    return Encoder.load(folder)


@pytest.fixture(scope="module")
def reference(folder: Path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    return sentence_transformers.SentenceTransformer(str(folder), device="cpu")


def test_attributes(encoder: Encoder):
    assert (encoder.dim, encoder.max_tokens, encoder.normalizes) == (384, 256, True)


def test_token_ids_match_the_reference_tokenizer(encoder: Encoder, reference):
    ours = encoder.tokenize(TEXTS)
    lengths = [len(ids) for ids in ours]
    assert 180 <= max(lengths) < 256, lengths  # the longest text is long, but under the limit
    assert ours == reference.tokenizer(TEXTS)["input_ids"]


def test_vectors_match_sentence_transformers(encoder: Encoder, reference):
    ours = encoder.embed(encoder.tokenize(TEXTS))
    theirs = reference.encode(TEXTS, convert_to_tensor=True).float()
    assert ours.shape == theirs.shape == (len(TEXTS), 384)
    assert ours.dtype == torch.float32
    cosine = torch.nn.functional.cosine_similarity(ours, theirs, dim=1)
    worst = int(cosine.argmin())
    print(f"worst cosine {cosine[worst].item():.8f} for {TEXTS[worst][:40]!r}")
    assert (cosine >= 1 - 1e-4).all(), cosine
    # Closer than the cosine bar can tell: tanh-approximated GELU still gives cosines above
    # 1 - 2e-6, but moves elements by 2.6e-4 (the exact forward is within 2e-7).
    print(f"largest element difference {(ours - theirs).abs().max().item():.2e}")
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.norm(dim=1), torch.ones(len(TEXTS)))


def test_a_vector_does_not_depend_on_its_batch(encoder: Encoder):
    short = encoder.tokenize(["What is the capital of France?"])[0]
    longer = encoder.tokenize([_LONG, _LONG * 3, "A quick brown fox jumps over the lazy dog."])
    alone = encoder.embed([short])[0]
    batch = encoder.embed([longer[0], short, longer[1], longer[2]])
    # The short input is padded to the longest in its chunk there: padding must be masked.
    torch.testing.assert_close(batch[1], alone, atol=1e-5, rtol=0)
    # Rows come back in the caller's order, not the length order they ran in.
    torch.testing.assert_close(batch[3], encoder.embed([longer[2]])[0], atol=1e-5, rtol=0)


def test_chunks_keep_within_the_budget_and_rows_in_order(encoder: Encoder, monkeypatch):
    texts = [f"sentence number {i} " * (1 + i % 7) for i in range(40)]
    ids = encoder.tokenize(texts)
    whole = encoder.embed(ids)
    padded_sizes = []
    run_chunk = encoder._embed_chunk

    def spy(rows):
        padded_sizes.append(len(rows) * max(len(r) for r in rows))
        return run_chunk(rows)

    monkeypatch.setattr(bert, "TOKEN_BUDGET", 64)
    monkeypatch.setattr(encoder, "_embed_chunk", spy)
    chunked = encoder.embed(ids)
    assert len(padded_sizes) > 5 and max(padded_sizes) <= 64, padded_sizes
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=0)
    for i in (0, 5, 21, 39):
        torch.testing.assert_close(whole[i], encoder.embed([ids[i]])[0], atol=1e-5, rtol=0)


def test_an_input_over_max_tokens_is_refused_by_index(encoder: Encoder):
    ids = encoder.tokenize(["short", "word " * 300])
    assert len(ids[1]) == 302  # never truncated, [CLS] and [SEP] included
    with pytest.raises(InputTooLong) as raised:
        encoder.embed(ids)
    assert (raised.value.index, raised.value.num_tokens, raised.value.max_tokens) == (1, 302, 256)
    assert str(raised.value) == "input[1] has 302 tokens; this model takes at most 256"
    assert isinstance(raised.value, ValueError)
    encoder.embed([ids[1][:256]])  # exactly the limit is taken


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda e: e.embed([]), "no input"),
        (lambda e: e.embed([[101, 102], []]), r"input\[1\] is empty"),
        (lambda e: e.tokenize([]), "no input"),
        (lambda e: e.tokenize(["fine", ""]), r"input\[1\] is empty"),
        (lambda e: e.embed([[101, 30522, 102]]), "outside the vocabulary"),
    ],
)
def test_empty_and_invalid_inputs_are_refused(encoder: Encoder, call, message):
    with pytest.raises(ValueError, match=message):
        call(encoder)


def _copy(folder: Path, to: Path) -> Path:
    """The folder's small json files copied, its weights and tokenizer linked (not copied)."""
    for name in ("config.json", "modules.json", "sentence_bert_config.json"):
        shutil.copy(folder / name, to / name)
    (to / "1_Pooling").mkdir()
    shutil.copy(folder / "1_Pooling" / "config.json", to / "1_Pooling" / "config.json")
    for name in ("model.safetensors", "tokenizer.json"):
        (to / name).symlink_to(folder / name)
    return to


def _edit(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_the_copied_folder_loads(folder: Path, tmp_path: Path):
    # The refusals below change one thing in this copy; unchanged, it loads.
    assert Encoder.load(_copy(folder, tmp_path)).dim == 384


def test_an_unknown_module_type_is_refused_by_name(folder: Path, tmp_path: Path):
    copy = _copy(folder, tmp_path)
    _edit(copy / "modules.json", lambda m: m[2].update(type="sentence_transformers.models.Dense"))
    with pytest.raises(ValueError, match=r"modules\.json: module type 'sentence_transformers"):
        Encoder.load(copy)


def test_mean_sqrt_len_pooling_is_refused_by_name(folder: Path, tmp_path: Path):
    copy = _copy(folder, tmp_path)
    _edit(
        copy / "1_Pooling" / "config.json",
        lambda c: c.update(pooling_mode_mean_tokens=False, pooling_mode_mean_sqrt_len_tokens=True),
    )
    with pytest.raises(ValueError, match="pooling_mode_mean_sqrt_len_tokens is not supported"):
        Encoder.load(copy)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("architectures", ["BertForMaskedLM"]),
        ("position_embedding_type", "relative_key"),
        ("hidden_act", "gelu_new"),
    ],
)
def test_a_config_it_does_not_compute_is_refused_by_field(folder, tmp_path, field, value):
    copy = _copy(folder, tmp_path)
    _edit(copy / "config.json", lambda c: c.update({field: value}))
    with pytest.raises(ValueError, match=rf"config\.json: {field} is"):
        Encoder.load(copy)


def test_a_missing_tensor_is_refused_by_name(folder: Path, tmp_path: Path):
    copy = _copy(folder, tmp_path)
    (copy / "model.safetensors").unlink()
    save_file({"embeddings.LayerNorm.weight": torch.ones(384)}, str(copy / "model.safetensors"))
    with pytest.raises(ValueError, match="tensor embeddings.word_embeddings.weight is missing"):
        Encoder.load(copy)


def test_weights_named_with_a_bert_prefix_load(folder: Path, tmp_path: Path, encoder: Encoder):
    copy = _copy(folder, tmp_path)
    (copy / "model.safetensors").unlink()
    weights = load_file(str(folder / "model.safetensors"))
    save_file({f"bert.{k}": v for k, v in weights.items()}, str(copy / "model.safetensors"))
    ids = encoder.tokenize(TEXTS[:3])
    torch.testing.assert_close(Encoder.load(copy).embed(ids), encoder.embed(ids))


@pytest.mark.parametrize("mode", ["cls", "max"])
def test_cls_and_max_pooling_match_sentence_transformers(folder, tmp_path, encoder, mode):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    copy = _copy(folder, tmp_path)
    _edit(
        copy / "1_Pooling" / "config.json",
        lambda c: c.update(pooling_mode_mean_tokens=False, **{_LEGACY_KEYS[mode]: True}),
    )
    ours = Encoder.load(copy)
    theirs = sentence_transformers.SentenceTransformer(str(copy), device="cpu")
    texts = TEXTS[:6]
    mine = ours.embed(ours.tokenize(texts))
    cosine = torch.nn.functional.cosine_similarity(
        mine, theirs.encode(texts, convert_to_tensor=True).float(), dim=1
    )
    assert (cosine >= 1 - 1e-4).all(), cosine
    # Another pooling gives other vectors than the mean: the mode was read, not ignored.
    assert (mine * encoder.embed(encoder.tokenize(texts))).sum(dim=1).max() < 0.999
