"""Which hosts name this machine only. One rule for every check that allows something on loopback
alone (plaintext, inference without keys, an insecure controller): the manifest's, `serve`'s and
the controller's own settings'.
"""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for `localhost` (any case), an address of 127.0.0.0/8, and ::1 (also bracketed, as
    URLs write it); False for any other name or address, wildcards (0.0.0.0, ::) included."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:  # a name other than localhost: it may resolve anywhere
        return False
