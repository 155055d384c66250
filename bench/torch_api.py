"""Does every torch API the GPU path calls exist in another torch release? Read from that release's
files (a wheel, never installed: the lease's torch 2.11 has no CPU wheel served here) rather than
imported: the `torch.a.b.c` names our code uses are found by reading it, and each is looked up
through the release's modules (`.py`, and the `.pyi` stubs that describe its compiled parts).

    python bench/torch_api.py WHEEL_OR_FOLDER      # names missing there, one a line; exit 1 if any

A name is `found` where each step is a submodule, a name a module binds (def, class, assignment,
import, `__all__`, a star import followed), or a class's attribute (its bases followed);
`unfollowed` where a step lands on something read cannot see into (a value made at run time,
such as `torch.ops`); `missing` where a step names nothing there: the call would raise
AttributeError or ImportError on that release.
"""

from __future__ import annotations

import ast
import functools
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What runs on a GPU lease: the worker (the engine, its kernels and their CUDA paths), what it
# shares, the check's own parts and the test files the check runs there.
GPU_PATH = (
    "worker",
    "common",
    "bench/gpu_check.py",
    "bench/gpu_parts.py",
    "bench/gpu_*.py",
    "bench/lease_*.py",
    "tests/worker/engine/reference.py",
    "tests/worker/engine/test_triton_paged.py",
    "tests/worker/engine/test_cuda_backends.py",
    "tests/worker/engine/test_triton_engine.py",
    "tests/worker/engine/test_paged_attention_kernels.py",
    "tests/worker/model/tiny_checkpoints.py",
)


def gpu_path_files(root: Path = ROOT) -> list[Path]:
    files: set[Path] = set()
    for entry in GPU_PATH:
        path = root / entry
        if path.is_dir():
            files |= set(path.rglob("*.py"))
        else:
            files |= set(root.glob(entry))
    return sorted(files)


# -- the names our code uses ------------------------------------------------------------------


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def used_names(source: str) -> set[str]:
    """Every `torch.…` name the source reaches: through `import torch[.x] [as y]`, `from torch.x
    import y [as z]`, and the attribute chains on those names (`F.silu` -> torch.nn.functional.
    silu). Calls end a chain: what a call returns is not a module's name."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or a.name.startswith("torch."):
                    if a.asname:
                        aliases[a.asname] = a.name
                    else:
                        aliases["torch"] = "torch"
                    found.add(a.name)
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "torch"
        ):
            for a in node.names:
                if a.name != "*":
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                    found.add(f"{node.module}.{a.name}")
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            chain = _dotted(node)
            if chain and chain[0] in aliases:
                found.add(".".join([aliases[chain[0]], *chain[1:]]))
    return found


def called_attributes(source: str) -> set[str]:
    """Every `x.name(...)` the source calls, on any object: the Tensor methods among them are
    found by asking a release whose Tensor has them (see `check`)."""
    return {
        node.func.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }


def names_in(files: list[Path]) -> dict[str, list[str]]:
    """name -> the files (relative to the root) that use it."""
    where: dict[str, list[str]] = {}
    for path in files:
        for name in used_names(path.read_text()):
            where.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return where


# -- a release's files ------------------------------------------------------------------------


class Files:
    """A release's files by path inside site-packages: a folder holding `torch/`, or a wheel."""

    def __init__(self, where: Path):
        self.where = where
        if where.is_file():
            self._zip = zipfile.ZipFile(where)
            self._names = set(self._zip.namelist())
        else:
            self._zip, self._names = None, None

    def read(self, path: str) -> str | None:
        if self._zip is not None:
            return self._zip.read(path).decode() if path in self._names else None
        file = self.where / path
        return file.read_text() if file.is_file() else None

    def version(self) -> str:
        text = self.read("torch/version.py") or ""
        for line in text.splitlines():
            if line.startswith("__version__"):
                return line.split("=", 1)[1].strip().strip("'\"")
        return "unknown"


@dataclass
class Binding:
    kind: str  # "module", "import", "class", "value"
    target: str = ""  # module: its name; import: the dotted name it binds
    node: ast.ClassDef | None = None
    module: str = ""  # where a class was defined (its bases are read there)


@dataclass
class Namespace:
    names: dict[str, Binding] = field(default_factory=dict)
    stars: list[str] = field(default_factory=list)


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _top_level(body: list[ast.stmt]):
    """Statements a module runs at its top, inside if/try/with blocks too."""
    for stmt in body:
        if isinstance(stmt, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody"):
                yield from _top_level(getattr(stmt, block, []))
            for handler in getattr(stmt, "handlers", []):
                yield from _top_level(handler.body)
        else:
            yield stmt


class Release:
    def __init__(self, files: Files):
        self.files = files

    def _sources(self, module: str) -> tuple[list[str], bool]:
        path = module.replace(".", "/")
        package = [self.files.read(f"{path}/__init__{s}") for s in (".py", ".pyi")]
        plain = [self.files.read(f"{path}{s}") for s in (".py", ".pyi")]
        if any(t is not None for t in package):
            return [t for t in package if t is not None], True
        return [t for t in plain if t is not None], False

    def is_module(self, module: str) -> bool:
        return bool(self._sources(module)[0])

    @functools.cache  # noqa: B019 - one Release per check
    def namespace(self, module: str) -> Namespace:
        sources, is_package = self._sources(module)
        space = Namespace()
        for text in sources:
            try:
                tree = ast.parse(text)
            except SyntaxError:
                continue
            for stmt in _top_level(tree.body):
                self._bind(space, stmt, module, is_package)
        return space

    def _bind(self, space: Namespace, stmt: ast.stmt, module: str, is_package: bool) -> None:
        names = space.names
        if isinstance(stmt, ast.ClassDef):
            names[stmt.name] = Binding("class", node=stmt, module=module)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.setdefault(stmt.name, Binding("value"))
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                for node in ast.walk(target):
                    if isinstance(node, ast.Name):
                        names.setdefault(node.id, Binding("value"))
            value = stmt.value
            is_all = any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)
            if is_all and isinstance(value, (ast.List, ast.Tuple)):
                for elt in value.elts:
                    if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                        names.setdefault(elt.value, Binding("value"))
        elif isinstance(stmt, ast.Import):
            for a in stmt.names:
                if a.asname:
                    names[a.asname] = Binding("module", a.name)
                else:
                    top = a.name.split(".")[0]
                    names.setdefault(top, Binding("module", top))
        elif isinstance(stmt, ast.ImportFrom):
            source = _absolute(module, is_package, stmt.level, stmt.module)
            for a in stmt.names:
                if a.name == "*":
                    space.stars.append(source)
                else:
                    names[a.asname or a.name] = Binding("import", f"{source}.{a.name}")

    def lookup(self, module: str, name: str, seen: frozenset[str] = frozenset()) -> Binding | None:
        if module in seen or len(seen) > 12:
            return None
        space = self.namespace(module)
        if name in space.names:
            return space.names[name]
        for star in space.stars:
            if star.split(".")[0] != "torch":
                continue
            if self.is_module(f"{star}.{name}"):
                return Binding("module", f"{star}.{name}")
            found = self.lookup(star, name, seen | {module})
            if found is not None:
                return found
        return None

    def resolve(self, dotted: str, depth: int = 0) -> tuple[str, str]:
        """("found" | "unfollowed" | "missing", a word on where it stopped)."""
        chain = dotted.split(".")
        if depth > 20:
            return "unfollowed", f"{dotted}: too many steps"
        if chain[0] != "torch":
            return "unfollowed", f"{dotted}: outside torch"
        module = "torch"
        for i, name in enumerate(chain[1:], start=1):
            rest = chain[i + 1 :]
            if self.is_module(f"{module}.{name}"):
                module = f"{module}.{name}"
                continue
            binding = self.lookup(module, name)
            if binding is None:
                return "missing", f"no {name!r} in {module}"
            if binding.kind == "module":
                return self.resolve(".".join([binding.target, *rest]), depth + 1)
            if binding.kind == "import":
                return self.resolve(".".join([binding.target, *rest]), depth + 1)
            if binding.kind == "class" and rest:
                return self._attribute(binding, rest[0], depth)
            return ("found", dotted) if not rest else ("unfollowed", f"{dotted}: past a value")
        return "found", dotted

    def _attribute(self, cls: Binding, attr: str, depth: int) -> tuple[str, str]:
        """A class's attribute: its body, else its bases' (as far as they can be read)."""
        node = cls.node
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if stmt.name == attr:
                    return "found", f"{node.name}.{attr}"
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                    return "found", f"{node.name}.{attr}"
        unread = []
        for base in node.bases:
            chain = _dotted(base)
            if not chain or depth > 10:
                unread.append(ast.unparse(base))
                continue
            binding = self.lookup(cls.module, chain[0])
            if binding is not None and binding.kind in ("module", "import"):
                target = ".".join([binding.target, *chain[1:]])
                binding = self._binding_of(target)
            if binding is None or binding.kind != "class":
                unread.append(ast.unparse(base))
                continue
            status, where = self._attribute(binding, attr, depth + 1)
            if status != "missing":
                return status, where
        if unread:
            return "unfollowed", f"{node.name}.{attr}: bases not read ({', '.join(unread)})"
        return "missing", f"no {attr!r} on {cls.module}.{node.name}"

    def _binding_of(self, dotted: str, depth: int = 0) -> Binding | None:
        module, _, name = dotted.rpartition(".")
        if not module or depth > 10:
            return None
        binding = self.lookup(module, name)
        if binding is not None and binding.kind == "import":
            return self._binding_of(binding.target, depth + 1)
        return binding


def installed_torch() -> Path:
    """The folder holding this interpreter's `torch/` (the release the code runs on here)."""
    import importlib.util

    return Path(importlib.util.find_spec("torch").origin).parents[1]


def check(where: Path, files: list[Path] | None = None, reference: Path | None = None) -> dict:
    """Every name the GPU path uses, looked up in the release at `where`; and every method it
    calls that the `reference` release's Tensor has (this interpreter's torch by default), looked
    up on that release's Tensor."""
    files = files if files is not None else gpu_path_files()
    release = Release(Files(where))
    known = Release(Files(reference or installed_torch()))
    used = names_in(files)
    for path in files:
        for method in called_attributes(path.read_text()):
            name = f"torch.Tensor.{method}"
            if name not in used and known.resolve(name)[0] == "found":
                used[name] = [str(path.relative_to(ROOT))]
            elif name in used:
                used[name].append(str(path.relative_to(ROOT)))
    results = {name: release.resolve(name) for name in sorted(used)}
    return {
        "release": release.files.version(),
        "names": len(results),
        "found": sum(s == "found" for s, _ in results.values()),
        "unfollowed": {n: w for n, (s, w) in results.items() if s == "unfollowed"},
        "missing": {
            n: {"why": w, "used_in": used[n]} for n, (s, w) in results.items() if s == "missing"
        },
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    found = check(Path(argv[0]))
    print(
        f"torch {found['release']}: {found['names']} names, {found['found']} found, "
        f"{len(found['unfollowed'])} unfollowed, {len(found['missing'])} missing"
    )
    for name, miss in found["missing"].items():
        print(f"missing: {name} ({miss['why']}; used in {', '.join(miss['used_in'])})")
    return 1 if found["missing"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
