"""The memory a worker can use on the CPU: the host's available memory within its cgroup's limit
(v1 and v2, its ancestors' too), read from files the tests write."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from intentserve.policy import ModelFacts
from intentserve.worker.capability import probe_capability
from intentserve.worker.memory import CgroupLimit, MemoryFiles, cgroup_limit, device_memory

GIB = 1 << 30
KIB = 1 << 10
CPU = torch.device("cpu")


def files(tmp_path: Path, self_cgroup: str, folders: dict[str, dict[str, str]]) -> MemoryFiles:
    """A /proc/meminfo of 24 GiB (20 GiB available), /proc/self/cgroup and cgroup folders."""
    (tmp_path / "meminfo").write_text(
        f"MemTotal: {24 * GIB // KIB} kB\nMemFree: {2 * GIB // KIB} kB\n"
        f"MemAvailable: {20 * GIB // KIB} kB\n"
    )
    (tmp_path / "cgroup").write_text(self_cgroup)
    root = tmp_path / "sys"
    for folder, contents in folders.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for name, text in contents.items():
            (root / folder / name).write_text(text)
    root.mkdir(exist_ok=True)
    return MemoryFiles(tmp_path / "meminfo", root, tmp_path / "cgroup")


def v2(limit: str, current: int, inactive_file: int = 0) -> dict[str, str]:
    stat = f"anon 1\ninactive_file {inactive_file}\nactive_file 3\n"
    return {"memory.max": limit, "memory.current": str(current), "memory.stat": stat}


def v1(limit: int, usage: int, inactive_file: int = 0) -> dict[str, str]:
    stat = f"cache 1\ntotal_inactive_file {inactive_file}\n"
    return {
        "memory.limit_in_bytes": str(limit),
        "memory.usage_in_bytes": str(usage),
        "memory.stat": stat,
    }


def test_without_a_cgroup_limit_it_is_the_hosts_available_memory(tmp_path):
    found = files(tmp_path, "0::/\n", {"": {"memory.max": "max"}})
    assert cgroup_limit(found) is None
    memory = device_memory(CPU, found)
    assert (memory.total_bytes, memory.usable_bytes) == (24 * GIB, 20 * GIB)


def test_a_v2_container_limit_caps_it_less_what_is_in_use(tmp_path):
    # A container's own cgroup is its root ("0::/"); reclaimable page cache is not in use.
    found = files(tmp_path, "0::/\n", {"": v2(str(8 * GIB), 3 * GIB, inactive_file=GIB)})
    assert cgroup_limit(found) == CgroupLimit(8 * GIB, 6 * GIB)
    memory = device_memory(CPU, found)
    assert (memory.total_bytes, memory.usable_bytes) == (8 * GIB, 6 * GIB)


def test_the_tightest_ancestor_wins(tmp_path):
    folders = {
        "kubepods/pod": v2(str(16 * GIB), 2 * GIB),
        "kubepods": v2(str(4 * GIB), 3 * GIB),  # the parent has 1 GiB left
        "": {},
    }
    found = files(tmp_path, "0::/kubepods/pod\n", folders)
    assert cgroup_limit(found) == CgroupLimit(4 * GIB, GIB)


@pytest.mark.parametrize(
    ("limit", "expected"),
    [(2 * GIB, CgroupLimit(2 * GIB, GIB)), (9223372036854771712, None)],  # v1's "unlimited"
)
def test_cgroup_v1(tmp_path, limit, expected):
    self_cgroup = "9:name=systemd:/\n4:memory:/process_api/job\n1:cpu,cpuacct:/\n0::/\n"
    folders = {"memory/process_api/job": v1(limit, int(1.5 * GIB), GIB // 2), "memory": {}}
    assert cgroup_limit(files(tmp_path, self_cgroup, folders)) == expected


def test_the_capability_reports_the_usable_memory(tmp_path):
    found = files(tmp_path, "0::/\n", {"": v2(str(8 * GIB), 3 * GIB)})
    facts = ModelFacts(architecture="llama", has_kv_cache=True)
    capability = probe_capability("cpu", facts, memory_files=found)
    assert (capability.total_memory_bytes, capability.free_memory_bytes) == (8 * GIB, 5 * GIB)
