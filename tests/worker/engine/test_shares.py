"""The GEMMs' loop sharing (tiles.h: share_init / share_next): every iteration is taken exactly
once, each thread walks its own share from the front, and a thread held up (here: asleep on its
first iteration, as one the OS stopped) has the rest of its share taken from the back by the
others instead of holding up the region. Built with the kernels' compiler and flags."""

import os
import shutil
import subprocess

import pytest
from intentserve.worker.kernels.library import COMMON_DIR

HAS_CC = any(shutil.which(name) for name in ("cc", "gcc", "clang"))

PROGRAM = r"""
#include <stdio.h>
#include <time.h>
#include "tiles.h"

int main(int argc, char **argv) {
    const int64_t n = atoll(argv[1]);
    int *taker = calloc(n, sizeof *taker), *stolen_by = calloc(n, sizeof *stolen_by);
    int64_t *order = calloc(n, sizeof *order);
    _Atomic int64_t clock = 0;
    struct share shares[SHARES_MAX];
#pragma omp parallel
    {
        share_init(shares, n);
#pragma omp barrier
        int first = 1;
        for (int64_t i, stolen; (i = share_next(shares, &stolen)) >= 0;) {
            if (omp_get_thread_num() == 0 && first) {  /* held up, as by the OS */
                struct timespec pause = {0, 50 * 1000 * 1000};
                nanosleep(&pause, NULL);
            }
            first = 0;
            taker[i] += 1;
            stolen_by[i] = stolen ? omp_get_thread_num() + 1 : 0;
            order[i] = atomic_fetch_add(&clock, 1);
        }
    }
    for (int64_t i = 0; i < n; ++i)
        printf("%d %d %lld\n", taker[i], stolen_by[i], (long long)order[i]);
    return 0;
}
"""


def _build(tmp_path):
    names = (os.environ.get("CC"), "cc", "gcc", "clang")
    cc = next(name for name in names if name and shutil.which(name))
    source = tmp_path / "shares.c"
    source.write_text(PROGRAM)
    binary = tmp_path / "shares"
    subprocess.run(
        [cc, "-O2", "-fopenmp", "-std=gnu11", f"-I{COMMON_DIR}", str(source), "-o", str(binary)],
        check=True,
        capture_output=True,
    )
    return binary


def _run(binary, n, threads):
    out = subprocess.run(
        [str(binary), str(n)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_DYNAMIC": "false"},
    ).stdout.split("\n")
    return [tuple(int(v) for v in line.split()) for line in out if line]


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine (cc, gcc or clang)")
@pytest.mark.parametrize("threads", [2, 3, 70])  # 70: more threads than SHARES_MAX (64)
def test_every_iteration_is_taken_once_and_a_held_up_share_is_taken_from_the_back(
    tmp_path, threads
):
    n = 200
    rows = _run(_build(tmp_path), n, threads)
    assert len(rows) == n
    assert all(taken == 1 for taken, _, _ in rows)
    # thread 0 was held up on the first iteration it took of its share [0, n / shares) (or
    # before it took any): it walked a prefix of its share, the others took the rest from its
    # end backwards
    share_end = n // min(threads, 64)
    own = [i for i in range(share_end) if not rows[i][1]]
    stolen = [i for i in range(share_end) if rows[i][1]]
    assert own == list(range(len(own))) and len(own) < share_end
    assert all(rows[i][1] != 1 for i in stolen)  # never by thread 0 itself
    # back to front, by each thread that took from it (the clock is read after the take, so
    # between two takers, one preempted in between, the clock may disagree with the take order)
    for thief in {rows[i][1] for i in stolen}:
        times = [rows[i][2] for i in stolen if rows[i][1] == thief]
        assert times == sorted(times, reverse=True)
