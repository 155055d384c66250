"""Request ids: the one place they are made, so a request reads the same in the controller's and
the worker's logs (the controller names a request before routing it; the engine names one that
arrives without a name)."""

from __future__ import annotations

import uuid


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex}"
