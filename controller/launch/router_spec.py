"""`spec.router`: a separate router of the deployment (`intentserve router`), and what it runs
with, from the manifest's typed fields."""

from __future__ import annotations

from typing import TYPE_CHECKING

from intentserve.controller.auth import Security
from intentserve.controller.launch.controller_spec import HttpLimitsSpec
from intentserve.controller.launch.section import Section
from intentserve.controller.router.settings import DEFAULT_ROUTER_PORT, RouterConfig
from intentserve.controller.router.watched import DEFAULT_MAX_STALE_S
from pydantic import Field

if TYPE_CHECKING:
    from intentserve.controller.launch.manifest import Manifest


class RouterSpec(Section):
    """A separate router (`intentserve router`): where it listens and how long it serves the last
    verified worker table while the controller is unreachable. `up`'s own router runs in the
    controller's process, on the controller's ports, and is never stale."""

    host: str = "127.0.0.1"
    port: int = Field(DEFAULT_ROUTER_PORT, ge=0, le=65535, description="0 picks a free port")
    # The OpenAI HTTP API with /health and /metrics (HTTPS with the router's certificate unless
    # insecure); null: none.
    http_port: int | None = Field(None, ge=0, le=65535)
    http: HttpLimitsSpec = HttpLimitsSpec()  # its deadlines and connection caps
    # Past this many seconds without a word from the controller the router stops serving
    # (health NOT_SERVING, requests UNAVAILABLE: controller_unreachable).
    max_stale_s: float = Field(DEFAULT_MAX_STALE_S, gt=0, allow_inf_nan=False)


def router_config(manifest: Manifest, controller: str, security: Security) -> RouterConfig:
    """What a separate router of `manifest`'s deployment runs with: `controller`, where it
    watches the table; `security`, its own certificate and secrets."""
    s = manifest.spec
    r, c = s.router, s.controller
    return RouterConfig(
        deployment=manifest.name,
        controller=controller,
        security=security,
        host=r.host,
        port=r.port,
        http_port=r.http_port,
        http_limits=r.http.limits(),
        max_stale_s=r.max_stale_s,
        model=s.model.served(),
        max_outstanding_per_worker=c.max_outstanding_per_worker,
        admission=c.admission.limits(),
    )
