"""The row-shared batch step against the kernels' split, alternated round by round in one
process (alone, or beside a side load). Needs the reverted patch: `struct dims.row_split` in
decode_layers.c, `CompiledDecode.dims.row_split` and `.row_slices` in decode_layers.py.

    python abrow.py DTYPE STREAMS ROUNDS [CPU_MS_PER_1K_TOKENS WAKEUPS_PER_TOKEN]
"""

import statistics
import sys

from intentserve.worker.runtime.heap import settle_heap

from bench import served_path as sp

dtype, streams, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
side = [float(x) for x in sys.argv[4:6]]
engine = sp.build_engine(dtype, 64)
settle_heap()
compiled = engine.runner.model.compiled_decode
texts = sp.prompts(64)[:streams]
sp.engine_run(engine, texts[:2], 8)  # warm-up
rates: dict[int, list[float]] = {0: [], 1: []}
slices = set()
for r in range(rounds):
    for mode in (0, 1) if r % 2 == 0 else (1, 0):
        compiled.dims.row_split = mode
        if side:
            rate = sp.side_load_run(engine, texts, 128, 1400, side[0], side[1])
        else:
            rate, _texts = sp.engine_run(engine, texts, 128)
        rates[mode].append(rate)
        if mode:
            slices.add(compiled.row_slices)
ratios = [b / a for a, b in zip(rates[0], rates[1], strict=True)]
print(
    f"{dtype} streams {streams} side load {side}: kernels split "
    f"{statistics.median(rates[0]):.1f}, rows shared {statistics.median(rates[1]):.1f}, ratio "
    f"{statistics.median(ratios):.3f}, rounds {[round(x, 3) for x in ratios]}, shares {slices}"
)
