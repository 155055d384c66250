"""What `up` prepares so that only the deployment's own workers and operators can change what
READY means: the CA and the certificates, the admin token, the clients' API keys.

    prepared = DeploymentSecurity.prepare(manifest, DeploymentDir(home, manifest.name))
    config = replace(manifest.controller_config(), security=prepared.security)
    worker_config["tls"] = prepared.worker_tls("local-0")   # each actor gets only its own key
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from intentserve.controller.auth import Security, SecurityError, read_secret_lines
from intentserve.controller.launch.client_keys import ClientKeys, KeyRule, client_keys
from intentserve.controller.launch.deployment_dir import DeploymentDir
from intentserve.controller.launch.manifest import Manifest
from intentserve.controller.launch.pki import DeploymentCa, PkiError


@dataclass(frozen=True)
class DeploymentSecurity:
    security: Security
    admin_token: str
    ca: DeploymentCa | None  # None: an insecure deployment (plaintext, no worker identity)
    keys: ClientKeys = ClientKeys(KeyRule.OPEN)  # what inference asks of a client
    plaintext_http: bool = False  # the HTTP API without TLS (loopback only, API keys required)

    @property
    def api_key(self) -> str | None:
        """The clients' key `up` made (plaintextHttp, no apiKeysFile)."""
        return self.keys.made_key

    @classmethod
    def prepare(cls, manifest: Manifest, state: DeploymentDir) -> DeploymentSecurity:
        """The CA is the operator's files, else the one kept in the deployment's `state`
        directory (made there the first time): workers a killed `up` left keep certificates
        of it."""
        s = manifest.spec.security
        c = manifest.spec.controller
        if s.admin_token_file:
            tokens = read_secret_lines(s.admin_token_file, "spec.security.adminTokenFile")
        else:
            tokens = frozenset({secrets.token_urlsafe(32)})
        keys = client_keys(s, may_make=True)
        ca = None
        tls = None
        if not s.insecure:
            try:
                ca = (
                    DeploymentCa.load(manifest.name, Path(s.ca_cert_file), Path(s.ca_key_file))
                    if s.ca_cert_file
                    else state.ca()
                )
            except PkiError as error:
                raise SecurityError(str(error)) from None
            hosts = tuple(h for h in (c.host, c.advertise_host) if h and h not in ("0.0.0.0", "::"))
            tls = ca.controller_identity(hosts)
        return cls(Security(tls, tokens, keys.api_keys), min(tokens), ca, keys, s.plaintext_http)

    def worker_tls(self, worker_id: str) -> dict[str, str] | None:
        """The worker's own certificate and key, and the CA; None when insecure."""
        return None if self.ca is None else self.ca.issue(worker_id).to_dict()


def describe_security(prepared: DeploymentSecurity) -> str:
    """One phrase for the start-up log."""
    s = prepared.security
    keys = f", {len(s.api_keys)} API keys" if s.api_keys else ", inference open (no API keys)"
    if prepared.keys.rule is KeyRule.OPEN_BY_CHOICE:
        keys = ", INSECURE: inference open to anyone (insecureOpenInference, no API keys)"
    if s.tls is None:
        return f"INSECURE: plaintext, workers unauthenticated; admin token required{keys}"
    http = "; HTTP in plaintext on loopback" if prepared.plaintext_http else ""
    return f"mutual TLS with the deployment's CA, admin token required{keys}{http}"
