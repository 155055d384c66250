"""intentserve: LLM serving where the operator's configuration is a policy, not a hint.

    from intentserve import LLM, SamplingParams

    llm = LLM(model="smollm2-135m", paged_attention="on")
    for out in llm.generate(["The capital of France is"], SamplingParams(max_tokens=16)):
        print(out.text)

The parts live in subpackages: `intentserve.policy` (pure decisions), `intentserve.worker` (the
engine and its server), `intentserve.controller` (the policy engine, CLI and launcher),
`intentserve.common` (what they share), and the contract, `intentserve.v1` (the generated gRPC
modules) with `intentserve.convert`. This module only hands names on: `LLM` and `SamplingParams`
are loaded on first use, so `import intentserve` loads nothing beyond the standard library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]

if TYPE_CHECKING:
    from intentserve.worker.engine.sampling import SamplingParams
    from intentserve.worker.llm import LLM

_LAZY = {
    "LLM": "intentserve.worker.llm",
    "SamplingParams": "intentserve.worker.engine.sampling",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'intentserve' has no attribute {name!r}")
