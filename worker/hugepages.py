"""Host memory on 2 MiB pages for what every decode step streams through: the packed projection
weights (and the KV cache, kv_pool.py).

    arena = HugePageArena(num_bytes)          # one mapping, 2 MiB-aligned, asked for huge pages
    weight = arena.take((out, in), torch.bfloat16)
    moved = move_weights_to_huge_pages(model)  # the packed projections, in place; bytes moved
    huge_page_bytes(weight)                    # what the kernel granted (AnonHugePages)

Why: a step at one stream reads every projection weight once, ~270 MB in bfloat16 for
SmolLM2-135M; on 4 KiB pages that is ~66,000 address translations a step, far more than the TLB
holds, each a page walk beside the loads. On 2 MiB pages it is ~135. Measured in one process on
the 2-core AMD EPYC, the same engine with its weights swapped between plain and huge-page copies,
alternated over 8 rounds: one stream bfloat16 8.89 -> 8.69 ms a step, float32 12.56 -> 11.97 ms
(docs/engine.md).

How: an anonymous private mapping (not torch's allocator, whose large blocks are plain mmaps
without the advice), over-allocated by 2 MiB so its aligned interior starts on a huge-page
boundary, and `madvise(MADV_HUGEPAGE)` before the first touch, so each fault takes a 2 MiB page
where Linux has one. Transparent huge pages set to `never`, a kernel without them, or another OS:
the same tensors on ordinary pages, nothing else differs (`thp_mode` says which; the builder logs
what was granted).
"""

from __future__ import annotations

import ctypes
import mmap
import re
from pathlib import Path

import torch
from torch import Tensor, nn

HUGE_PAGE = 2 << 20
ALIGN = 64  # every tensor carved from an arena starts on a cache line
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
SMAPS = Path("/proc/self/smaps")

_MOVABLE = ("packed",)  # the projection weights the GEMM kernels stream (packed_linear, quant)


def thp_mode(path: Path = THP_ENABLED) -> str:
    """The host's transparent huge page setting: "always", "madvise", "never", or "unavailable"
    (no such setting: not Linux, or a kernel built without them)."""
    try:
        text = path.read_text()
    except OSError:
        return "unavailable"
    chosen = re.search(r"\[(\w+)\]", text)
    return chosen.group(1) if chosen else "unavailable"


class HugePageArena:
    """`num_bytes` of zeroed host memory in one mapping asked for 2 MiB pages; `take` carves
    tensors from it in order. The tensors keep the mapping alive (no `close` to call)."""

    def __init__(self, num_bytes: int) -> None:
        if num_bytes < 0:
            raise ValueError(f"num_bytes: {num_bytes} is negative")
        self.num_bytes = num_bytes
        self._used = 0
        advise = getattr(mmap, "MADV_HUGEPAGE", None)
        flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
        if advise is None or not flags or thp_mode() in ("never", "unavailable"):
            # NOTE: nothing to ask for: torch's own allocation, the same zeroed bytes.
            self._bytes = torch.zeros(max(num_bytes, 1), dtype=torch.uint8)
            return
        mapping = mmap.mmap(-1, num_bytes + HUGE_PAGE, flags=flags)
        mapping.madvise(advise)  # before any page is touched: faults then take 2 MiB pages
        offset = -ctypes.addressof(ctypes.c_char.from_buffer(mapping)) % HUGE_PAGE
        self._bytes = torch.frombuffer(
            mapping, dtype=torch.uint8, offset=offset, count=max(num_bytes, 1)
        )

    @property
    def free_bytes(self) -> int:
        return self.num_bytes - self._used

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """A contiguous tensor of `shape` and `dtype` from the arena (zeroed on first touch);
        ValueError when it does not fit in what is left."""
        count = 1
        for size in shape:
            count *= size
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        start = -(-self._used // ALIGN) * ALIGN
        if start + nbytes > self.num_bytes:
            raise ValueError(
                f"{tuple(shape)} {dtype} needs {nbytes} bytes; the arena has "
                f"{self.num_bytes - start} of {self.num_bytes} left"
            )
        self._used = start + nbytes
        return self._bytes[start : start + nbytes].view(dtype).view(shape)

    @staticmethod
    def size_for(tensors: list[Tensor]) -> int:
        """The bytes an arena needs to hold copies of `tensors`, each aligned as `take` does."""
        total = 0
        for t in tensors:
            total = -(-total // ALIGN) * ALIGN + t.numel() * t.element_size()
        return total


def move_weights_to_huge_pages(model: nn.Module) -> int:
    """Copy every packed projection weight of `model` (the buffers named `packed` on the host)
    into one huge-page arena and hold the copies in their place; the old ones are freed. Returns
    the bytes moved (0: none on the host, or nothing packed). Call it before anything takes the
    weights' addresses (the compiled decode step does, when it is built)."""
    owners = [
        (module, name)
        for module in model.modules()
        for name in _MOVABLE
        if isinstance(t := module._buffers.get(name), Tensor)
        and t.device.type == "cpu"
        and t.is_contiguous()
        and t.numel()
    ]
    if not owners:
        return 0
    tensors = [module._buffers[name] for module, name in owners]
    arena = HugePageArena(HugePageArena.size_for(tensors))
    for (module, name), tensor in zip(owners, tensors, strict=True):
        copy = arena.take(tuple(tensor.shape), tensor.dtype)
        copy.copy_(tensor)
        module._buffers[name] = copy
    return arena.num_bytes


def huge_page_bytes(tensor: Tensor, smaps: Path = SMAPS) -> int:
    """The bytes of 2 MiB pages backing the mapping that holds `tensor`'s first byte, as the
    kernel reports them (AnonHugePages in /proc/self/smaps); 0 where there is no such report."""
    address = tensor.data_ptr()
    try:
        lines = smaps.read_text().splitlines()
    except OSError:
        return 0
    inside = False
    for line in lines:
        span = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if span:
            inside = int(span.group(1), 16) <= address < int(span.group(2), 16)
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return 0
