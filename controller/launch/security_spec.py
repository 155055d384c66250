"""`spec.security`: the options of the deployment's security and which combinations of them
are refused (README: Security); whether a host is loopback, where plaintext may be allowed."""

from __future__ import annotations

from intentserve.controller.launch.section import Section
from intentserve.policy import IntentError
from pydantic import model_validator


class SecuritySpec(Section):
    """Mutual TLS between the controller and its workers, the admin token and the clients' API
    keys (README: Security). The defaults are secure: a fresh CA per `up`."""

    insecure: bool = False  # plaintext, no worker identity: loopback only, unless...
    insecure_network: bool = False  # ...this says that plaintext off loopback is wanted
    ca_cert_file: str | None = None  # the operator's CA (e.g. a Kubernetes Secret), with its key
    ca_key_file: str | None = None
    admin_token_file: str | None = None  # default: a fresh token per `up`
    api_keys_file: str | None = None  # one key per line; set: Inference needs one of them
    # The HTTP API in plaintext, so that a local client needs no CA file, while gRPC and the
    # workers keep TLS. Loopback only, and never open: without apiKeysFile, `up` makes a key.
    plaintext_http: bool = False
    # Inference open where the key above would be required (no apiKeysFile): every process
    # that serves it (`up`, a separate router) says so loudly; without it a router refuses.
    insecure_open_inference: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> SecuritySpec:
        if (self.ca_cert_file is None) != (self.ca_key_file is None):
            missing = "caKeyFile" if self.ca_key_file is None else "caCertFile"
            raise IntentError(missing, "give both caCertFile and caKeyFile, or neither")
        if self.insecure and self.ca_cert_file is not None:
            raise IntentError("insecure", "true, but a CA is given for TLS; choose one")
        if self.insecure_network and not self.insecure:
            raise IntentError("insecureNetwork", "only applies with insecure: true")
        if self.plaintext_http and self.insecure:
            raise IntentError("plaintextHttp", "true, but insecure already makes all plaintext")
        if self.insecure_open_inference and (self.api_keys_file or not self.plaintext_http):
            raise IntentError(
                "insecureOpenInference",
                "only applies with plaintextHttp: true and no apiKeysFile, where inference would "
                "need a key (elsewhere it needs apiKeysFile's keys, or none)",
            )
        return self
