"""bench/gpu_check.py's running of its parts, with stand-in parts (no torch work): the order of
the table and of the lease host's parts after it, `--parts`, the budget, the report written after
every part, and the command that reruns what failed."""

from __future__ import annotations

import importlib
import json
import os
import sys
import types

import pytest

from bench import gpu_check
from bench.gpu_parts import PartFailed

OURS = list(gpu_check.PARTS)
SCRIPT = os.path.relpath(gpu_check.__file__)  # as the rerun command names it


def _module(**functions) -> types.ModuleType:
    module = types.ModuleType(gpu_check.LEASE_HOST_MODULE)
    for name, fn in functions.items():
        setattr(module, name, fn)
    return module


def _found(device: str) -> dict:
    return {"device": device}


def test_the_table_is_in_the_order_of_value():
    assert OURS == [
        "gpu_tests",
        "engine_parity",
        "throughput",
        "served_over_tls",
        "flex_vs_triton",
    ]


def test_without_the_lease_host_module_only_the_table_runs(monkeypatch):
    monkeypatch.setitem(sys.modules, gpu_check.LEASE_HOST_MODULE, None)  # import: not found
    assert list(gpu_check.all_parts()) == OURS


def test_the_lease_host_parts_come_last_in_their_order(monkeypatch):
    module = _module(relay_routers=_found, amx_kernels=_found, helper=_found)
    monkeypatch.setitem(sys.modules, gpu_check.LEASE_HOST_MODULE, module)
    parts = gpu_check.all_parts()
    assert list(parts) == [*OURS, "amx_kernels", "relay_routers"]
    assert parts["relay_routers"] is _found


def test_only_the_lease_host_parts_its_module_defines_are_appended(monkeypatch):
    monkeypatch.setitem(sys.modules, gpu_check.LEASE_HOST_MODULE, _module(relay_routers=_found))
    assert list(gpu_check.all_parts()) == [*OURS, "relay_routers"]


def test_a_lease_host_module_that_fails_to_import_fails_its_parts_by_name(monkeypatch):
    def broken(name, *args, **kwargs):
        raise ModuleNotFoundError("No module named 'absent_dependency'", name="absent_dependency")

    monkeypatch.setattr(importlib, "import_module", broken)
    parts = gpu_check.all_parts()
    assert list(parts) == [*OURS, "amx_kernels", "relay_routers"]
    result = gpu_check.run_part(parts["amx_kernels"], "cpu")
    assert result["ok"] is False
    assert "bench.lease_host_parts does not import" in result["error"]
    assert "absent_dependency" in result["error"]


def test_parts_names_some_in_the_tables_order():
    parts = {"a": _found, "b": _found, "c": _found}
    assert list(gpu_check.choose_parts(parts, "c, a")) == ["a", "c"]
    assert list(gpu_check.choose_parts(parts, None)) == ["a", "b", "c"]


@pytest.mark.parametrize(("names", "said"), [("a,zz", "unknown part 'zz'"), (",", "no part named")])
def test_parts_refuses_a_name_it_does_not_have_listing_the_allowed(names, said):
    with pytest.raises(ValueError) as refused:
        gpu_check.choose_parts({"a": _found, "b": _found}, names)
    assert str(refused.value) == f"--parts: {said}; allowed: a, b"


def test_an_unknown_part_on_the_command_line_exits_2_naming_it(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, gpu_check.LEASE_HOST_MODULE, None)
    with pytest.raises(SystemExit) as exited:
        gpu_check.main(["--out", "/nonexistent", "--parts", "gpu_tests,nope"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"--parts: unknown part 'nope'; allowed: {', '.join(OURS)}" in err


def test_a_part_due_after_the_budget_is_recorded_as_not_started():
    now = iter([0.0, 0.0, 4.0, 10.5])  # the start, then before each part
    seen: list[list[str]] = []
    ran: list[str] = []

    def part(name):
        def run(device):
            ran.append(name)
            return {}

        return run

    parts = {name: part(name) for name in ("a", "b", "c")}
    results = gpu_check.run_parts(
        parts, "cpu", 10.0, lambda r: seen.append(list(r)), clock=lambda: next(now)
    )
    assert ran == ["a", "b"]
    assert results["c"]["ok"] is False
    assert results["c"]["error"] == "not started: budget of 10 s spent (10 s in)"
    assert seen == [["a"], ["a", "b"], ["a", "b", "c"]]  # written after every part


def test_a_part_that_takes_a_cap_is_cut_to_end_by_the_end():
    """The lease host's parts (240 s caps) started late in the budget get only what is left
    before `end_s`, so the call still ends in time; a part without a cap is called as it is."""
    now = iter([0.0, 0.0, 300.0, 470.0])
    caps: dict[str, float] = {}

    def capped(name):
        def run(device, cap_s=240.0):
            caps[name] = cap_s
            return {}

        return run

    parts = {"plain": lambda device: {}, "early": capped("early"), "late": capped("late")}
    results = gpu_check.run_parts(
        parts, "cpu", 480.0, lambda r: None, clock=lambda: next(now), end_s=480.0
    )
    assert all(r["ok"] for r in results.values())
    assert caps == {"early": 180.0, "late": 10.0}
    # With no end given, a cap keeps its own default.
    now = iter([0.0, 0.0])
    gpu_check.run_parts(
        {"early": capped("early")}, "cpu", 1e9, lambda r: None, clock=lambda: next(now)
    )
    assert caps["early"] == 240.0


def test_a_failed_part_keeps_its_findings_and_the_next_still_runs():
    def fails(device):
        raise PartFailed("2 of 3 unequal", {"cases": {"x": False}})

    def raises(device):
        raise RuntimeError("boom")

    parts = {"fails": fails, "raises": raises, "after": _found}
    results = gpu_check.run_parts(parts, "cpu", 100.0, lambda r: None)
    assert results["fails"] | {"seconds": 0} == {
        "ok": False,
        "error": "2 of 3 unequal",
        "cases": {"x": False},
        "seconds": 0,
    }
    assert results["raises"]["error"] == "RuntimeError: boom"
    assert results["after"]["ok"] and results["after"]["device"] == "cpu"


def test_the_rerun_commands_name_what_failed_here_and_on_a_lease(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    rerun = gpu_check.rerun_commands(["b", "c"], tmp_path, dry_run=False, budget_s=200)
    assert rerun["here"] == (
        f"PYTHONPATH=/tmp/site {sys.executable} {SCRIPT} --out {tmp_path}/rerun "
        "--parts b,c --budget-s 200"
    )
    assert rerun["lease"] == "GPU_CHECK_ARGS='--parts b,c --budget-s 200' bash bench/gpu_lease.sh"
    monkeypatch.delenv("PYTHONPATH")
    again = gpu_check.rerun_commands(["c"], tmp_path / "rerun", True, gpu_check.DEFAULT_BUDGET_S)
    assert again["here"] == f"{sys.executable} {SCRIPT} --out {tmp_path}/rerun --parts c --dry-run"
    assert again["lease"] == "GPU_CHECK_ARGS='--parts c --dry-run' bash bench/gpu_lease.sh"


def test_a_run_writes_each_result_as_it_ends_and_says_how_to_rerun_the_failed(
    tmp_path, capsys, monkeypatch
):
    report = tmp_path / "gpu_check.json"

    def first(device):
        return {"figure": 1.5}

    def second(device):
        written = json.loads(report.read_text())  # what a run cut off here would leave
        raise RuntimeError(f"saw {sorted(written['parts'])}")

    monkeypatch.setattr(gpu_check, "PARTS", {"first": first, "second": second, "third": _found})
    monkeypatch.setitem(sys.modules, gpu_check.LEASE_HOST_MODULE, None)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    code = gpu_check.main(["--out", str(tmp_path), "--dry-run", "--parts", "second,first"])
    assert code == 1
    found = json.loads(report.read_text())
    assert found["asked"] == ["first", "second"] and list(found["parts"]) == ["first", "second"]
    assert found["parts"]["second"]["error"] == "RuntimeError: saw ['first']"
    rerun = f"{sys.executable} {SCRIPT} --out {tmp_path}/rerun --parts second --dry-run"
    on_lease = "GPU_CHECK_ARGS='--parts second --dry-run' bash bench/gpu_lease.sh"
    assert found["rerun"] == {"here": rerun, "lease": on_lease}
    out = capsys.readouterr().out
    assert "[gpu-check] failed: second" in out
    assert f"[gpu-check] rerun just those: {rerun}" in out
    assert f"[gpu-check] or, on a lease: {on_lease}" in out
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| first | True |" in table and "| second | False |" in table
    assert rerun in table and on_lease in table
