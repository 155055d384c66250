"""Which Ray cluster `intentserve up` uses, and why, decided the way Ray's own tools decide it.

`--ray-address` wins; without it, `RAY_ADDRESS` (which `ray job submit` sets for its entry point,
and an operator may export) names the cluster to join; without either, `up` starts an embedded
cluster. `local` (flag or variable) means an embedded cluster, as in `ray.init(address="local")`.
Imports no ray: the CLI decides before ray is loaded.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass

RAY_ADDRESS_ENV = "RAY_ADDRESS"
LOCAL = "local"


class RaySource(enum.Enum):
    """Where the choice came from."""

    FLAG = "--ray-address"
    ENVIRONMENT = RAY_ADDRESS_ENV
    DEFAULT = "default"


@dataclass(frozen=True)
class RayTarget:
    address: str | None  # None: start an embedded cluster; else what ray.init joins
    source: RaySource

    @property
    def embedded(self) -> bool:
        return self.address is None

    def describe(self) -> str:
        """One line for the progress output: embedded or joined, and why."""
        if self.source is RaySource.DEFAULT:
            return f"starting an embedded cluster (no --ray-address, {RAY_ADDRESS_ENV} unset)"
        if self.embedded:
            return f"starting an embedded cluster ({self.source.value} is {LOCAL})"
        if self.source is RaySource.FLAG:
            return f"joining {self.address} (--ray-address)"
        return (
            f"joining {self.address} ({RAY_ADDRESS_ENV} is set and --ray-address is not given; "
            f"--ray-address {LOCAL} starts an embedded cluster instead)"
        )


def choose_ray_target(flag: str | None, environ: Mapping[str, str] = os.environ) -> RayTarget:
    """The flag's address, else RAY_ADDRESS's, else an embedded cluster; blank counts as unset."""
    for value, source in (
        (flag, RaySource.FLAG),
        (environ.get(RAY_ADDRESS_ENV), RaySource.ENVIRONMENT),
    ):
        address = (value or "").strip()
        if address:
            return RayTarget(None if address == LOCAL else address, source)
    return RayTarget(None, RaySource.DEFAULT)
