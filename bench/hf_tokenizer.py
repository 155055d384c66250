"""A Hugging Face tokenizer folder (`tokenizer.json` + `tokenizer_config.json`) for a GGUF model,
so that a client which counts tokens with transformers (vLLM's `vllm bench serve --tokenizer DIR`,
docs/benchmarks.md) counts them as the worker does, with no model hub. The tokenizer is the
worker's own, rebuilt from the GGUF's metadata (worker/model/gguf_tokenizer.py).

    .venv/bin/python bench/hf_tokenizer.py smollm2-135m /tmp/smollm2-tok
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import tokenizers
from intentserve.worker.model.gguf_loader import open_gguf
from intentserve.worker.model.gguf_tokenizer import build_gguf_tokenizer
from intentserve.worker.model.loaded import ModelLoadError
from intentserve.worker.model.registry import resolve_model_path
from intentserve.worker.model.tokenizer import Tokenizer
from tokenizers import processors


def write_tokenizer_folder(model: str, folder: Path) -> dict:
    """Writes the folder; returns the config written. ValueError names the model when it is not
    a GGUF file (a Hugging Face folder already holds its tokenizer: the client takes it as is)."""
    path = resolve_model_path(model)
    if path.suffix != ".gguf":
        raise ValueError(
            f"model: {model!r} resolves to {path}, not a .gguf file (allowed: a GGUF file or a "
            "short name of one; a Hugging Face folder holds its own tokenizer: pass the folder)"
        )
    tokenizer = build_gguf_tokenizer(open_gguf(path).metadata)

    def token_text(token_id: int | None) -> str | None:
        return None if token_id is None else tokenizer.backend.id_to_token(token_id)

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token_text(tokenizer.bos_token_id),
        "eos_token": token_text(tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None),
        "add_bos_token": tokenizer.add_bos_token,
        "add_eos_token": False,  # build_gguf_tokenizer refuses a GGUF that asks for it
        "chat_template": tokenizer.chat_template,
    }
    folder.mkdir(parents=True, exist_ok=True)
    _with_bos_template(tokenizer).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return config


def _with_bos_template(tokenizer: Tokenizer) -> tokenizers.Tokenizer:
    """The backend, with BOS added by its post-processor where the checkpoint adds it: the worker
    prepends BOS itself (Tokenizer.encode), transformers only through tokenizer.json."""
    backend = tokenizers.Tokenizer.from_str(tokenizer.backend.to_str())
    if tokenizer.add_bos_token and tokenizer.bos_token_id is not None:
        bos = tokenizer.backend.id_to_token(tokenizer.bos_token_id)
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A $B:1",
            special_tokens=[(bos, tokenizer.bos_token_id)],
        )
    return backend


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a GGUF file or a short name (smollm2-135m, gemma3-270m)")
    parser.add_argument("folder", type=Path, help="where to write the tokenizer folder")
    args = parser.parse_args(argv)
    try:
        config = write_tokenizer_folder(args.model, args.folder)
    except (ValueError, ModelLoadError) as exc:
        parser.error(str(exc))
    print(
        f"wrote {args.folder}/tokenizer.json and tokenizer_config.json (bos {config['bos_token']!r}"
        f", eos {config['eos_token']!r}, add_bos_token {config['add_bos_token']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
