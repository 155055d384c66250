"""A BERT sentence encoder for /v1/embeddings: a sentence-transformers folder, run in plain torch.

The folder is what sentence-transformers saves: config.json, model.safetensors and tokenizer.json
for the BERT encoder, modules.json (Transformer, Pooling, optionally Normalize), the Pooling
module's config.json and sentence_bert_config.json (max_seq_length). Whatever this module cannot
reproduce exactly is refused at load with a ValueError naming the file and the field, so a vector
it returns is the one sentence-transformers gives for the same text.

Inputs are never truncated (sentence-transformers cuts them at max_seq_length without a word):
one longer than `max_tokens` is refused with InputTooLong, which says which input and by how much.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor

# modules.json types, in the only order they may come (Normalize may be left out).
_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"
_MODULE_TYPES = (_TRANSFORMER, _POOLING, _NORMALIZE)

_POOLING_MODES = frozenset({"cls", "max", "mean"})
# The Pooling config's older boolean keys -> their mode, in the order sentence-transformers
# concatenates the pooled vectors when several are set.
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}

# Most padded tokens (rows x longest row) one forward takes: bounds the activations' memory
# (256 tokens x 384 floats x a few buffers per row) while keeping the matmuls large.
TOKEN_BUDGET = 8192


class InputTooLong(ValueError):
    """An input has more tokens than the model takes (it is refused, never truncated)."""

    def __init__(self, index: int, num_tokens: int, max_tokens: int) -> None:
        super().__init__(
            f"input[{index}] has {num_tokens} tokens; this model takes at most {max_tokens}"
        )
        self.index = index
        self.num_tokens = num_tokens
        self.max_tokens = max_tokens


@dataclass(frozen=True)
class _Layer:
    """One encoder layer's weights; q, k and v stacked into one matrix (one matmul, not three)."""

    qkv_weight: Tensor
    qkv_bias: Tensor
    attention_out_weight: Tensor
    attention_out_bias: Tensor
    attention_norm_weight: Tensor
    attention_norm_bias: Tensor
    up_weight: Tensor
    up_bias: Tensor
    down_weight: Tensor
    down_bias: Tensor
    output_norm_weight: Tensor
    output_norm_bias: Tensor


class Encoder:
    """Texts -> token ids -> one pooled vector per input.

    `dim` is the vector's length, `max_tokens` the most tokens (with [CLS] and [SEP]) an input
    may have, `normalizes` whether vectors come L2-normalized (modules.json has Normalize).
    Build it with `Encoder.load`.
    """

    def __init__(
        self,
        *,
        tokenizer: tokenizers.Tokenizer,
        lowercase: bool,
        weights: dict[str, Tensor],
        layers: list[_Layer],
        num_heads: int,
        layer_norm_eps: float,
        pooling: tuple[str, ...],
        normalizes: bool,
        max_tokens: int,
    ) -> None:
        self._tokenizer = tokenizer
        self._lowercase = lowercase
        self._word = weights["embeddings.word_embeddings.weight"]
        self._position = weights["embeddings.position_embeddings.weight"]
        self._token_type0 = weights["embeddings.token_type_embeddings.weight"][0]
        self._norm_weight = weights["embeddings.LayerNorm.weight"]
        self._norm_bias = weights["embeddings.LayerNorm.bias"]
        self._layers = layers
        self._num_heads = num_heads
        self._eps = layer_norm_eps
        self._hidden = self._word.shape[1]
        self._pooling = pooling
        self.dim = self._hidden * len(pooling)
        self.max_tokens = max_tokens
        self.normalizes = normalizes
        self.vocab_size = self._word.shape[0]
        self.dtype = self._word.dtype
        # Resident bytes of every tensor held (what a worker reports as its weights).
        self.weight_bytes = sum(t.numel() * t.element_size() for t in weights.values())

    @classmethod
    def load(cls, folder: Path, *, dtype: torch.dtype = torch.float32) -> Encoder:
        """Read a sentence-transformers folder; weights in `dtype`, on the CPU.

        ValueError, naming the file and field, for anything not reproduced exactly: another
        architecture or position embedding, another activation, a module or pooling mode
        this module lacks, a missing or misshapen tensor.
        """
        folder = Path(folder)
        modules = _read_modules(folder)
        transformer_dir = folder / modules[0].get("path", "")
        config = _read_json(transformer_dir / "config.json")
        _check_config(transformer_dir / "config.json", config)
        hidden = config["hidden_size"]
        st_config_path = transformer_dir / "sentence_bert_config.json"
        st_config = _read_json(st_config_path) if st_config_path.is_file() else {}
        max_positions = config["max_position_embeddings"]
        max_tokens = min(st_config.get("max_seq_length") or max_positions, max_positions)
        pooling_dir = folder / modules[1].get("path", "")
        pooling = _read_pooling(pooling_dir / "config.json", hidden)

        weights = _read_weights(transformer_dir / "model.safetensors", config, dtype)
        layers = [
            _layer(weights, f"encoder.layer.{i}.") for i in range(config["num_hidden_layers"])
        ]
        tokenizer = tokenizers.Tokenizer.from_file(str(transformer_dir / "tokenizer.json"))
        # tokenizer.json may carry a truncation (MiniLM's says 128) and padding: inputs are
        # taken whole and measured here, and batches are padded by `embed`.
        tokenizer.no_truncation()
        tokenizer.no_padding()
        return cls(
            tokenizer=tokenizer,
            lowercase=bool(st_config.get("do_lower_case", False)),
            weights=weights,
            layers=layers,
            num_heads=config["num_attention_heads"],
            layer_norm_eps=config["layer_norm_eps"],
            pooling=pooling,
            normalizes=len(modules) == 3,
            max_tokens=max_tokens,
        )

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids, [CLS] and [SEP] included, at full length (never truncated).

        ValueError for an empty list or an empty text (it would embed [CLS][SEP] alone).
        """
        if not texts:
            raise ValueError("no input to tokenize")
        for i, text in enumerate(texts):
            if not text:
                raise ValueError(f"input[{i}] is empty")
        if self._lowercase:
            texts = [text.lower() for text in texts]
        return [encoding.ids for encoding in self._tokenizer.encode_batch(texts)]

    def detokenize(self, ids: list[int]) -> str:
        """The text of token ids, special tokens ([CLS], [SEP], [PAD]) left out."""
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def embed(self, token_ids: list[list[int]]) -> Tensor:
        """One float32 vector per input, shape [len(token_ids), dim], rows in the inputs' order.

        `token_ids` are taken as the model sees them (from `tokenize`: [CLS] ... [SEP]).
        InputTooLong for an input over `max_tokens`; ValueError for an empty list, an empty
        input or an id outside the vocabulary. Inputs are run sorted by length, in chunks of at
        most TOKEN_BUDGET padded tokens, so little is padding; padding is masked from attention
        and pooling, so a vector does not depend on what else is in the batch.
        """
        if not token_ids:
            raise ValueError("no input to embed")
        vocab_size = self._word.shape[0]
        for i, ids in enumerate(token_ids):
            if not ids:
                raise ValueError(f"input[{i}] is empty")
            if len(ids) > self.max_tokens:
                raise InputTooLong(i, len(ids), self.max_tokens)
            if min(ids) < 0 or max(ids) >= vocab_size:
                raise ValueError(
                    f"input[{i}] has a token id outside the vocabulary [0, {vocab_size})"
                )
        order = sorted(range(len(token_ids)), key=lambda i: len(token_ids[i]))
        out = torch.empty(len(token_ids), self.dim, dtype=torch.float32)
        with torch.inference_mode():
            for chunk in _chunks(order, [len(ids) for ids in token_ids]):
                out[chunk] = self._embed_chunk([token_ids[i] for i in chunk])
        return out

    def _embed_chunk(self, rows: list[list[int]]) -> Tensor:
        """Pooled (and normalized) float32 vectors for rows padded to the longest of them."""
        longest = max(len(ids) for ids in rows)
        ids = torch.zeros(len(rows), longest, dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, : len(row)] = torch.tensor(row)
        lengths = torch.tensor([len(row) for row in rows])
        keep = torch.arange(longest)[None, :] < lengths[:, None]  # [rows, longest]; False: padding
        all_kept = bool(keep.all())
        hidden = self._forward(ids, None if all_kept else keep).float()
        return self._pool(hidden, keep, lengths)

    def _forward(self, ids: Tensor, keep: Tensor | None) -> Tensor:
        """BERT's encoder: [rows, n] token ids -> [rows, n, hidden] last hidden states.

        `keep` ([rows, n], False at padding) masks padded keys out of attention; None when no
        row is padded. Token type is 0 for every token (one segment, as sentence-transformers).
        """
        rows, n = ids.shape
        heads = self._num_heads
        head_dim = self._hidden // heads
        shape = (self._hidden,)
        x = self._word[ids] + self._position[:n] + self._token_type0
        x = F.layer_norm(x, shape, self._norm_weight, self._norm_bias, self._eps)
        mask = None if keep is None else keep[:, None, None, :]  # broadcast over heads, queries
        for layer in self._layers:
            qkv = F.linear(x, layer.qkv_weight, layer.qkv_bias)
            q, k, v = qkv.view(rows, n, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            attended = attended.transpose(1, 2).reshape(rows, n, self._hidden)
            x = F.layer_norm(
                x + F.linear(attended, layer.attention_out_weight, layer.attention_out_bias),
                shape,
                layer.attention_norm_weight,
                layer.attention_norm_bias,
                self._eps,
            )
            up = F.gelu(F.linear(x, layer.up_weight, layer.up_bias))  # exact (erf) GELU
            x = F.layer_norm(
                x + F.linear(up, layer.down_weight, layer.down_bias),
                shape,
                layer.output_norm_weight,
                layer.output_norm_bias,
                self._eps,
            )
        return x

    def _pool(self, hidden: Tensor, keep: Tensor, lengths: Tensor) -> Tensor:
        """[rows, n, hidden] -> [rows, dim]: the pooling modes' vectors side by side, over the
        unpadded tokens only, then L2-normalized when the folder says so."""
        pooled = []
        for mode in self._pooling:
            if mode == "cls":
                pooled.append(hidden[:, 0])
            elif mode == "max":
                pooled.append(hidden.masked_fill(~keep[:, :, None], float("-inf")).amax(dim=1))
            else:  # mean
                summed = (hidden * keep[:, :, None]).sum(dim=1)
                pooled.append(summed / lengths[:, None].to(summed.dtype))
        vectors = torch.cat(pooled, dim=1)
        return F.normalize(vectors, p=2, dim=1) if self.normalizes else vectors


def _chunks(order: list[int], lengths: list[int]) -> list[list[int]]:
    """Split `order` (input indices, shortest first) into runs whose rows x longest stays
    within TOKEN_BUDGET; an input alone over the budget runs alone."""
    chunks: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * lengths[i] > TOKEN_BUDGET:
            chunks.append(current)
            current = []
        current.append(i)
    if current:
        chunks.append(current)
    return chunks


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    return json.loads(path.read_text(encoding="utf-8"))


def _read_modules(folder: Path) -> list[dict[str, Any]]:
    """modules.json's entries, checked to be Transformer, Pooling and optionally Normalize."""
    path = folder / "modules.json"
    modules = sorted(_read_json(path), key=lambda m: m.get("idx", 0))
    types = [m.get("type") for m in modules]
    for t in types:
        if t not in _MODULE_TYPES:
            raise ValueError(
                f"{path}: module type {t!r} is not supported "
                f"(supported: {', '.join(_MODULE_TYPES)})"
            )
    if types not in (list(_MODULE_TYPES[:2]), list(_MODULE_TYPES)):
        raise ValueError(
            f"{path}: modules must be Transformer, Pooling and optionally Normalize, in that "
            f"order; found {types}"
        )
    return modules


def _check_config(path: Path, config: dict[str, Any]) -> None:
    """Refuse a config.json whose model is not the BERT that `Encoder._forward` computes."""
    if config.get("architectures") != ["BertModel"]:
        raise ValueError(
            f"{path}: architectures is {config.get('architectures')!r}; only BertModel is supported"
        )
    position = config.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise ValueError(
            f"{path}: position_embedding_type is {position!r}; only 'absolute' is supported"
        )
    activation = config.get("hidden_act")
    if activation != "gelu":
        raise ValueError(f"{path}: hidden_act is {activation!r}; only 'gelu' (erf) is supported")
    if config["hidden_size"] % config["num_attention_heads"]:
        raise ValueError(f"{path}: hidden_size is not a multiple of num_attention_heads")


def _read_pooling(path: Path, hidden: int) -> tuple[str, ...]:
    """The Pooling config's modes, in concatenation order: the `pooling_mode` key (a mode or a
    list) or the older `pooling_mode_*` booleans; none set means mean, as sentence-transformers.
    """
    config = _read_json(path)
    size = config.get("embedding_dimension", config.get("word_embedding_dimension", hidden))
    if size != hidden:
        raise ValueError(
            f"{path}: embedding dimension {size} is not the model's hidden size {hidden}"
        )
    if "pooling_mode" in config:
        given = config["pooling_mode"]
        modes = (given,) if isinstance(given, str) else tuple(given)
        for mode in modes:
            if mode not in _POOLING_MODES:
                raise ValueError(
                    f"{path}: pooling_mode {mode!r} is not supported "
                    f"(supported: {', '.join(sorted(_POOLING_MODES))})"
                )
        return modes or ("mean",)
    modes = []
    for key, value in config.items():
        if key.startswith("pooling_mode_") and value is True:
            mode = _LEGACY_POOLING_KEYS.get(key)
            if mode not in _POOLING_MODES:
                raise ValueError(
                    f"{path}: {key} is not supported "
                    f"(supported: {', '.join(sorted(_POOLING_MODES))} pooling)"
                )
            modes.append(mode)
    order = list(_LEGACY_POOLING_KEYS.values())
    return tuple(sorted(modes, key=order.index)) or ("mean",)


def _read_weights(path: Path, config: dict[str, Any], dtype: torch.dtype) -> dict[str, Tensor]:
    """The safetensors tensors under BertModel's names (a "bert." prefix dropped), each checked
    to be present with the shape config.json implies, in `dtype`."""
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    raw = load_file(str(path))
    weights = {name.removeprefix("bert."): tensor for name, tensor in raw.items()}
    hidden = config["hidden_size"]
    inner = config["intermediate_size"]
    expected = {
        "embeddings.word_embeddings.weight": (config["vocab_size"], hidden),
        "embeddings.position_embeddings.weight": (config["max_position_embeddings"], hidden),
        "embeddings.token_type_embeddings.weight": (config["type_vocab_size"], hidden),
        "embeddings.LayerNorm.weight": (hidden,),
        "embeddings.LayerNorm.bias": (hidden,),
    }
    per_layer = {
        "attention.self.query.weight": (hidden, hidden),
        "attention.self.query.bias": (hidden,),
        "attention.self.key.weight": (hidden, hidden),
        "attention.self.key.bias": (hidden,),
        "attention.self.value.weight": (hidden, hidden),
        "attention.self.value.bias": (hidden,),
        "attention.output.dense.weight": (hidden, hidden),
        "attention.output.dense.bias": (hidden,),
        "attention.output.LayerNorm.weight": (hidden,),
        "attention.output.LayerNorm.bias": (hidden,),
        "intermediate.dense.weight": (inner, hidden),
        "intermediate.dense.bias": (inner,),
        "output.dense.weight": (hidden, inner),
        "output.dense.bias": (hidden,),
        "output.LayerNorm.weight": (hidden,),
        "output.LayerNorm.bias": (hidden,),
    }
    for i in range(config["num_hidden_layers"]):
        expected |= {f"encoder.layer.{i}.{name}": shape for name, shape in per_layer.items()}
    out = {}
    for name, shape in expected.items():
        tensor = weights.get(name)
        if tensor is None:
            raise ValueError(f"{path}: tensor {name} is missing")
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{path}: tensor {name} has shape {tuple(tensor.shape)}, not {shape}")
        out[name] = tensor.to(dtype)
    return out


def _layer(weights: dict[str, Tensor], prefix: str) -> _Layer:
    def w(name: str) -> Tensor:
        return weights[prefix + name]

    return _Layer(
        qkv_weight=torch.cat([w(f"attention.self.{p}.weight") for p in ("query", "key", "value")]),
        qkv_bias=torch.cat([w(f"attention.self.{p}.bias") for p in ("query", "key", "value")]),
        attention_out_weight=w("attention.output.dense.weight"),
        attention_out_bias=w("attention.output.dense.bias"),
        attention_norm_weight=w("attention.output.LayerNorm.weight"),
        attention_norm_bias=w("attention.output.LayerNorm.bias"),
        up_weight=w("intermediate.dense.weight"),
        up_bias=w("intermediate.dense.bias"),
        down_weight=w("output.dense.weight"),
        down_bias=w("output.dense.bias"),
        output_norm_weight=w("output.LayerNorm.weight"),
        output_norm_bias=w("output.LayerNorm.bias"),
    )
