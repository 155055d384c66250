"""What one worker is started with. The launcher sends it as plain data (it crosses into a Ray
actor, and the controller never imports worker/); `WorkerSpec.from_dict` checks it here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from intentserve.common.tls import TlsIdentity
from intentserve.policy import KvBudget, PagedAttentionConfig, WeightFormat
from intentserve.worker.engine.builder import EngineConfig
from intentserve.worker.runtime.ports import advertised_host


@dataclass(frozen=True)
class WorkerSpec:
    worker_id: str
    controller_address: str  # host:port of the controller's WorkerRegistry
    model: str = "smollm2-135m"
    dtype: str = "auto"
    chat_template: str | None = None  # spec.model.chatTemplate's text; None: the checkpoint's
    device: str = "cpu"
    device_map: tuple[str, ...] = ()
    no_kv_cache: bool = False
    max_model_len: int | None = None
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    stream_interval: int = 1  # tokens per streamed message after a request's first
    num_threads: int | None = None  # torch threads; None leaves the process default
    host: str = "127.0.0.1"  # where the worker's gRPC server binds
    advertise_host: str | None = None  # where the controller reaches it; default from `host`
    register_timeout_s: float = 60.0  # keep trying to reach the controller this long
    rpc_timeout_s: float = 10.0
    # Mutual TLS with the controller: this worker's own certificate and key and the deployment's
    # CA (PEM text, as `TlsIdentity.to_dict` gives it), and the deployment's name, which names
    # the controller's certificate. None: plaintext (an insecure deployment).
    tls: dict[str, str] | None = None
    deployment: str = ""
    log_format: str = "text"  # or "json": the controller's `--log-format` (intentserve.common.logs)

    @property
    def tls_identity(self) -> TlsIdentity | None:
        return TlsIdentity.from_dict(self.tls) if self.tls is not None else None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerSpec:
        """ValueError naming the unknown keys; a list becomes a tuple."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"worker spec: unknown keys {unknown}; known: {sorted(known)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def engine_config(
        self,
        paged: PagedAttentionConfig | None,
        kv_budget: KvBudget,
        weights: WeightFormat = WeightFormat.AUTO,
    ) -> EngineConfig:
        """The engine to build, with the policy, the KV budget and the weight format the
        controller sent."""
        return EngineConfig(
            model=self.model,
            dtype=self.dtype,
            chat_template=self.chat_template,
            device=self.device,
            paged=paged,
            kv_budget=kv_budget,
            weights=weights,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            device_map=self.device_map,
            no_kv_cache=self.no_kv_cache,
        )

    def address(self, port: int) -> str:
        host = self.advertise_host or advertised_host(self.host, self.controller_address)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
