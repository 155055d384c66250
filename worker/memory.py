"""The memory a worker can use: on CUDA the device's free memory; on the CPU the host's available
memory, within the limit of the process's cgroup. In a container the cgroup's limit is what the
OOM killer enforces, whatever the host has free.

cgroup v2: memory.max ("max" when unlimited), memory.current, memory.stat `inactive_file`.
cgroup v1: memory/memory.limit_in_bytes (a huge number when unlimited), memory.usage_in_bytes,
memory.stat `total_inactive_file`.
The process's cgroup is read from /proc/self/cgroup; its ancestors' limits apply too, so the
tightest headroom (limit less usage) wins. Page cache the kernel can drop (inactive files) does
not count as used.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

_UNLIMITED_V1 = 1 << 62  # v1 reports "no limit" as a number near 2**63


@dataclass(frozen=True)
class MemoryFiles:
    """Where the figures are read; tests point these at files of their own."""

    meminfo: Path = Path("/proc/meminfo")
    cgroup_root: Path = Path("/sys/fs/cgroup")
    self_cgroup: Path = Path("/proc/self/cgroup")


SYSTEM_FILES = MemoryFiles()


@dataclass(frozen=True)
class Memory:
    total_bytes: int  # the device's, or the host's within the cgroup's limit
    usable_bytes: int  # what can still be allocated


@dataclass(frozen=True)
class CgroupLimit:
    limit_bytes: int
    headroom_bytes: int  # limit less the memory in use


def device_memory(device: torch.device, files: MemoryFiles = SYSTEM_FILES) -> Memory:
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return Memory(total, free)
    host = _meminfo(files.meminfo)
    total, available = host["MemTotal"], host.get("MemAvailable", host["MemFree"])
    limit = cgroup_limit(files)
    if limit is None:
        return Memory(total, available)
    return Memory(min(total, limit.limit_bytes), min(available, limit.headroom_bytes))


def cgroup_limit(files: MemoryFiles = SYSTEM_FILES) -> CgroupLimit | None:
    """The tightest memory limit over this process's cgroup and its ancestors; None if none."""
    limits = [limit for folder in _cgroup_folders(files) if (limit := _limit_in(folder))]
    if not limits:
        return None
    return CgroupLimit(
        min(limit.limit_bytes for limit in limits), min(limit.headroom_bytes for limit in limits)
    )


def _meminfo(path: Path) -> dict[str, int]:
    fields = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        fields[name] = int(rest.split()[0]) * 1024
    return fields


def _cgroup_folders(files: MemoryFiles) -> Iterator[Path]:
    """The folders of this process's memory cgroup and of its ancestors, v2 and v1."""
    try:
        lines = files.self_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            base = files.cgroup_root  # v2: one unified hierarchy
        elif "memory" in controllers.split(","):
            base = files.cgroup_root / "memory"
        else:
            continue
        folder = base / path.lstrip("/")
        while True:
            yield folder
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent


def _limit_in(folder: Path) -> CgroupLimit | None:
    v2 = folder / "memory.max"
    if v2.exists():
        text = v2.read_text().strip()
        if text == "max":
            return None
        usage = int((folder / "memory.current").read_text())
        return _headroom(int(text), usage, _stat(folder, "inactive_file"))
    v1 = folder / "memory.limit_in_bytes"
    if v1.exists():
        limit = int(v1.read_text())
        if limit >= _UNLIMITED_V1:
            return None
        usage = int((folder / "memory.usage_in_bytes").read_text())
        return _headroom(limit, usage, _stat(folder, "total_inactive_file"))
    return None


def _headroom(limit: int, usage: int, reclaimable: int) -> CgroupLimit:
    return CgroupLimit(limit, max(0, limit - max(0, usage - reclaimable)))


def _stat(folder: Path, name: str) -> int:
    try:
        lines = (folder / "memory.stat").read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    return 0
