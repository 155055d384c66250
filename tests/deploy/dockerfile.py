"""A reader of the Dockerfile for its lint (no container engine runs the tests): instructions by
stage, with continuation lines joined and `${ARG}` references resolved to their defaults."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

_REFERENCE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    text: str  # the rest, continuation lines joined, ARG defaults substituted


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        """Every ENV of the stage, later ones winning."""
        found: dict[str, str] = {}
        for instruction in self.all("ENV"):
            found |= dict(word.split("=", 1) for word in shlex.split(instruction.text))
        return found

    def args(self) -> dict[str, str]:
        """The stage's ARG defaults."""
        return dict(_arg(i.text) for i in self.all("ARG"))

    def exec_form(self, keyword: str) -> list[str] | None:
        """The last CMD or ENTRYPOINT as a list of words; None if there is none or it is in
        shell form (which runs under /bin/sh and does not receive the signals)."""
        found = self.all(keyword)
        try:
            return json.loads(found[-1].text) if found else None
        except ValueError:
            return None


@dataclass(frozen=True)
class Copy:
    sources: tuple[str, ...]
    destination: str
    from_stage: str | None


def _arg(text: str) -> tuple[str, str]:
    name, _, default = text.partition("=")
    return name.strip(), default.strip().strip('"')


def _logical_lines(text: str) -> list[str]:
    lines, pending = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1].strip() + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    return lines


def _substitute(text: str, scope: dict[str, str]) -> str:
    """`${NAME}` / `$NAME` replaced by the ARG default in scope; others (`$PATH`) kept."""
    return _REFERENCE.sub(lambda m: scope.get(m.group(1) or m.group(2), m.group(0)), text)


def parse(
    path: Path, build_args: dict[str, str] | None = None
) -> tuple[dict[str, str], list[Stage]]:
    """The global ARG defaults and the stages, in order; `build_args` (`docker build
    --build-arg NAME=VALUE`) override the defaults of the ARGs they name, as docker does."""
    build_args = build_args or {}
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in _logical_lines(path.read_text()):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = _substitute(rest, global_args if not stages else global_args | stages[-1].args())
        if keyword == "FROM":
            words = rest.split()
            stages.append(Stage(words[0], words[2] if len(words) == 3 else None))
        elif keyword == "ARG" and not stages:
            name, default = _arg(rest)
            global_args[name] = build_args.get(name, default)
        elif keyword == "ARG":
            name, default = _arg(rest)
            given = f"{name}={build_args[name]}" if name in build_args else rest.strip()
            stages[-1].instructions.append(Instruction(keyword, given))
        else:
            stages[-1].instructions.append(Instruction(keyword, rest.strip()))
    return global_args, stages


def copies(stage: Stage) -> list[Copy]:
    found = []
    for instruction in stage.all("COPY"):
        words = shlex.split(instruction.text)
        flags = dict(w[2:].split("=", 1) for w in words if w.startswith("--"))
        paths = [w for w in words if not w.startswith("--")]
        found.append(Copy(tuple(paths[:-1]), paths[-1], flags.get("from")))
    return found


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore's `patterns` leave `path` (or a folder above it) out of the build
    context. As Docker matches: from the context's root; `**/` matches at any depth."""
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        if pattern.startswith("**/"):
            bare = pattern[3:]
            if any(fnmatch.fnmatch(part, bare) for part in parts):
                return True
        elif any(fnmatch.fnmatch(prefix, pattern.rstrip("/")) for prefix in prefixes):
            return True
    return False


def dockerignore(path: Path) -> list[str]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]
