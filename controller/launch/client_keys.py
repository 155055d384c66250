"""The clients' API keys: what inference asks of a client, one rule for every process that serves
it, `up` (and `serve`) and `intentserve router` alike (README: Security).

    keys = client_keys(manifest.spec.security, may_make=True)   # `up`: it may make the key
    Security(tls, tokens, keys.api_keys)
    if (warning := keys.warning("this router")) is not None: ...  # open on purpose: say so

Inference needs a key where the manifest says so: `apiKeysFile` gives the keys, and
`plaintextHttp` without it needs the key `up` makes (a plaintext API is never open by accident).
A separate router cannot know a key another process made, so there it refuses to start, unless
`insecureOpenInference` says that inference is to be open, which every process then says loudly.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from enum import Enum

from intentserve.controller.auth import SecurityError, read_secret_lines
from intentserve.controller.launch.security_spec import SecuritySpec

KEYS_FIELD = "spec.security.apiKeysFile"
OPEN_FIELD = "spec.security.insecureOpenInference"


class KeyRule(Enum):
    """What the manifest makes inference ask of a client."""

    KEYS_FILE = "keys_file"  # one of apiKeysFile's keys
    MADE_KEY = "made_key"  # plaintextHttp without apiKeysFile: the key `up` makes for the run
    OPEN = "open"  # no key: neither is set (TLS, or plaintext on loopback by `insecure`)
    OPEN_BY_CHOICE = "open_by_choice"  # insecureOpenInference: no key where one was required


def key_rule(s: SecuritySpec) -> KeyRule:
    if s.api_keys_file:
        return KeyRule.KEYS_FILE
    if s.plaintext_http:
        return KeyRule.OPEN_BY_CHOICE if s.insecure_open_inference else KeyRule.MADE_KEY
    return KeyRule.OPEN


@dataclass(frozen=True)
class ClientKeys:
    rule: KeyRule
    api_keys: frozenset[str] = frozenset()  # empty: inference is open
    made_key: str | None = None  # MADE_KEY: the key made for this run, shown to who started it

    def warning(self, who: str) -> str | None:
        """The loud line for inference open on purpose (`who`: the process that serves it)."""
        if self.rule is not KeyRule.OPEN_BY_CHOICE:
            return None
        return (
            f"{OPEN_FIELD} is true: {who} serves inference to anyone who reaches it, with no "
            "API key (gRPC Inference, and the HTTP API's /v1, /tokenize and /detokenize)"
        )


def client_keys(s: SecuritySpec, *, may_make: bool) -> ClientKeys:
    """The keys a serving process checks. `may_make`: whether this process may make the key the
    rule requires (`up`, which prints it to whoever started it); a process that may not (a
    separate router: its clients hold `up`'s key) refuses instead, naming both fields."""
    rule = key_rule(s)
    if rule is KeyRule.KEYS_FILE:
        return ClientKeys(rule, read_secret_lines(s.api_keys_file, KEYS_FIELD))
    if rule is KeyRule.MADE_KEY:
        if not may_make:
            raise SecurityError(
                f"{KEYS_FIELD}: not set, and spec.security.plaintextHttp is true, so `up` serves "
                "inference only with the API key it makes for its run, which a router cannot "
                f"know: give apiKeysFile (the file `up` reads too), or set {OPEN_FIELD}: true to "
                "serve inference to anyone, on purpose"
            )
        # NOTE: a plaintext API is never open by accident: any local user could reach it.
        made = f"sk-intentserve-{secrets.token_urlsafe(24)}"
        return ClientKeys(rule, frozenset({made}), made)
    return ClientKeys(rule)
