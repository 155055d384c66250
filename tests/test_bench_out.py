"""bench/out.py: a bench's results go outside the source tree unless `--out` says otherwise."""

import subprocess
from pathlib import Path

from bench.out import default_out

ROOT = Path(__file__).resolve().parents[1]


def test_the_default_is_under_xdg_cache_home_when_it_is_set(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_out("engine.json") == tmp_path / "intentserve" / "bench" / "engine.json"


def test_without_xdg_cache_home_it_is_under_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_out("x.json") == tmp_path / ".cache" / "intentserve" / "bench" / "x.json"
    monkeypatch.setenv("XDG_CACHE_HOME", "")  # set but empty counts as unset (the spec's rule)
    assert default_out("x.json") == tmp_path / ".cache" / "intentserve" / "bench" / "x.json"


def test_a_stray_run_in_bench_results_is_ignored_by_git():
    done = subprocess.run(
        ["git", "check-ignore", "-q", "bench/results/engine.json"], cwd=ROOT, check=False
    )
    assert done.returncode == 0
