"""proto/ holds the contract only: the .proto files and their generator, the generated modules,
the one converter, and the package face, which hands names on and imports nothing of its own
beyond the standard library (what it hands on is loaded at first use)."""

from pathlib import Path

import pytest

from tests.import_checks import loaded_beyond_stdlib, offenders

PROTO = Path(__file__).resolve().parents[2] / "proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
ROOMS = {"intentserve.worker", "intentserve.controller", "intentserve.client", "intentserve.common"}
# NOTE: the face names what it hands on for type checkers only (under TYPE_CHECKING); the test
# below proves it imports none of it when `intentserve` is imported.
FACE_TYPES = {("__init__.py", "intentserve.worker")}


def _names(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir() if path.name != "__pycache__"}


def test_proto_holds_the_generator_and_the_package_only():
    assert _names(PROTO) == {"generate.py", "intentserve"}


def test_the_package_folder_holds_the_face_the_converter_and_the_generated_contract():
    assert _names(PROTO / "intentserve") == {"__init__.py", "convert.py", "v1"}


def test_the_generated_folder_holds_each_proto_and_its_generated_modules_only():
    v1 = PROTO / "intentserve" / "v1"
    sources = {path.stem for path in v1.glob("*.proto")}
    assert sources, "the contract lost its .proto files"
    generated = {f"{stem}{suffix}" for stem in sources for suffix in GENERATED_SUFFIXES}
    assert _names(v1) == {"__init__.py", *(f"{stem}.proto" for stem in sources), *generated}


def test_the_contract_imports_no_other_room():
    assert offenders(PROTO / "intentserve", ROOMS, FACE_TYPES) == []


@pytest.mark.integration
def test_the_face_imports_nothing_beyond_the_standard_library():
    # `LLM` and `SamplingParams` are handed on at first use, not on `import intentserve`.
    assert loaded_beyond_stdlib("intentserve") == ["intentserve"]
