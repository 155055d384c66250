"""The memory a worker can use on the CPU: the host's available memory within its cgroup's limit
(v1 and v2, its ancestors' too), read from files the tests write; and the host allocator's
settings a CPU engine makes (keep_freed_memory)."""

from __future__ import annotations

import platform
import subprocess
import sys
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


# -- the host allocator (keep_freed_memory) ------------------------------------------------------

FAULTS_SCRIPT = """
import resource, sys, torch
import torch.nn.functional as F
from intentserve.worker.memory import keep_freed_memory
if sys.argv[1] == "tuned":
    print(keep_freed_memory(), file=sys.stderr)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.manual_seed(0)
T, H, I = 1568, 576, 1536  # a 32-prompt prefill step of SmolLM2's widths
w = [(torch.randn(960, H), torch.randn(H, H), torch.randn(2 * I, H), torch.randn(H, I))] * 16
def prefill():  # a decoder's temporaries for T tokens, layer after layer
    x = torch.randn(T, H)
    for qkv_w, o_w, gate_up_w, down_w in w:
        qkv = F.linear(x, qkv_w)
        x = x + F.linear(qkv[:, :H], o_w)
        gate, up = F.linear(x, gate_up_w).chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, down_w)
    return float(x.sum())
prefill()  # warm: the first one faults its pages in whatever the settings
start = faults()
for _ in range(3):
    prefill()
print((faults() - start) / 3)
"""


@pytest.mark.integration
@pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc",
    reason="the tuning is glibc's mallopt; this host's libc is not glibc",
)
def test_freed_memory_is_reused_without_fresh_page_faults_once_tuned():
    """A prefill's large temporaries were mapped, faulted in page by page and unmapped again every
    step (150,000 page faults in a 32-prompt prefill step, ~25% of it); tuned, the freed pages
    are reused."""

    def faults_per_prefill(mode: str) -> float:
        done = subprocess.run(
            [sys.executable, "-c", FAULTS_SCRIPT, mode], capture_output=True, text=True, check=True
        )
        return float(done.stdout.split()[-1])

    # what a prefill allocates: 16 layers' q|k|v, o, gate|up, SiLU * up and down outputs
    pages = 16 * 1568 * (960 + 576 + 2 * 1536 + 1536 + 576) * 4 // 4096  # ~165,000
    plain, tuned = faults_per_prefill("plain"), faults_per_prefill("tuned")
    assert tuned < 0.02 * pages  # 0-1,900 here
    assert plain > max(0.02 * pages, 2.5 * tuned)  # 7,400-42,000 here: 30-170 MB mapped afresh


def test_keep_freed_memory_says_what_it_set_or_why_not(monkeypatch):
    from intentserve.worker import memory

    calls = []
    monkeypatch.setattr(
        memory, "_mallopt", lambda: lambda param, value: calls.append((param, value)) or 1
    )
    said = memory.keep_freed_memory()
    assert calls == [(memory.M_MMAP_THRESHOLD, 64 << 20), (memory.M_TRIM_THRESHOLD, 256 << 20)]
    assert "64 MiB" in said and "256 MiB" in said
    monkeypatch.setattr(memory, "_mallopt", lambda: None)
    assert "not glibc" in memory.keep_freed_memory()
    monkeypatch.setattr(memory, "_mallopt", lambda: lambda param, value: 0)
    assert "refused" in memory.keep_freed_memory()
