"""The committed gRPC modules are what the .proto files generate, and the contract is documented."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "proto"))
from generate import SOURCES, generate  # noqa: E402

COMMITTED = ROOT / "proto" / "intentserve" / "v1"


def test_generated_modules_are_not_stale(tmp_path):
    fresh = generate(tmp_path)
    assert fresh, "protoc generated nothing"
    stale = [
        path.name
        for path in fresh
        if not (COMMITTED / path.name).exists()
        or (COMMITTED / path.name).read_bytes() != path.read_bytes()
    ]
    assert stale == [], (
        f"generated modules are stale relative to the .proto files: {stale}; "
        "run `make proto` and commit the result"
    )
    extra = {p.name for p in COMMITTED.glob("*_pb2*.py*")} - {p.name for p in fresh}
    assert extra == set(), f"generated modules without a .proto: {sorted(extra)}"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_every_message_enum_field_and_rpc_is_commented(source):
    lines = source.read_text().splitlines()
    assert re.search(r"^package intentserve\.v1;$", source.read_text(), re.M)
    declaration = re.compile(
        r"^\s*(message|enum|service|rpc)\s+\w+"  # declarations
        r"|^\s*(repeated\s+|optional\s+)?[\w.]+\s+\w+\s*=\s*\d+;"  # fields
        r"|^\s*[A-Z][A-Z0-9_]*\s*=\s*\d+;"  # enum values
    )
    undocumented = [
        f"{source.name}:{i + 1}: {line.strip()}"
        for i, line in enumerate(lines)
        if declaration.match(line)
        and not lines[i - 1].strip().startswith("//")
        and not re.search(r"_UNSPECIFIED = 0;", line)
    ]
    assert undocumented == []


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_enums_start_with_unspecified_zero(source):
    text = source.read_text()
    for name, body in re.findall(r"enum (\w+) \{(.*?)\}", text, re.S):
        first = re.search(r"(\w+)\s*=\s*(\d+);", body)
        assert first.group(2) == "0" and first.group(1).endswith("_UNSPECIFIED"), name
