"""The GPU check's report: gpu_check.json (every finding) and gpu_check.md (tables to read), each
written whole after every part and replaced in one rename, so a run cut off leaves the last
complete one."""

from __future__ import annotations

import json
import os
from pathlib import Path

FINDING_CHARS = 400


def write_report(report: dict, out: Path) -> None:
    """`report`: host, dry_run, budget_s, asked (the parts in order), parts (name -> result so
    far), rerun (the commands for what failed or was not reached, `here` and on a `lease`;
    empty when nothing was)."""
    _replace(out / "gpu_check.json", json.dumps(report, indent=2, default=str) + "\n")
    _replace(out / "gpu_check.md", markdown(report))


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _cell(value) -> str:
    if isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, dict | list):
        text = json.dumps(value, default=str)
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]


def markdown(report: dict) -> str:
    title = "dry run, CPU" if report["dry_run"] else report["host"].get("gpu", "CUDA")
    lines = [f"# gpu-check ({title})", ""]
    lines += [f"- {k}: {v}" for k, v in report["host"].items()]
    lines += [f"- budget: parts start within {report['budget_s']:g} s", ""]
    parts = report["parts"]
    summary = []
    for name in report["asked"]:
        part = parts.get(name)
        if part is None:
            summary.append([name, "-", "-", "not reached (running, or the run was cut off)"])
            continue
        rest = {k: v for k, v in part.items() if k not in ("ok", "seconds", "rows", "error")}
        finding = part.get("error") or json.dumps(rest, default=str)
        summary.append([name, part["ok"], part["seconds"], finding[:FINDING_CHARS]])
    lines += _table(["part", "ok", "seconds", "finding"], summary)
    for name, part in parts.items():
        rows = part.get("rows")
        if not rows:
            continue
        columns = list(dict.fromkeys(k for row in rows for k in row))
        lines += ["", f"## {name}", ""]
        lines += _table(columns, [[row.get(c, "") for c in columns] for row in rows])
    if report["rerun"]:
        left = [n for n in report["asked"] if not parts.get(n, {}).get("ok")]
        lines += ["", f"Failed or not reached: {', '.join(left)}. Rerun just those:", ""]
        lines += ["```", report["rerun"]["here"], "```", "", "or, on a lease:", ""]
        lines += ["```", report["rerun"]["lease"], "```"]
    else:
        lines += ["", f"All {len(report['asked'])} parts ok."]
    return "\n".join(lines) + "\n"
