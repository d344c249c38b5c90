"""The house rules of docs/design.md §16, checked on the package's own source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ragent_memory"
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 60
# Calls that build a mutable container; at module or class level they are shared state.
MUTABLE_CALLS = frozenset(
    {
        "dict",
        "list",
        "set",
        "bytearray",
        "OrderedDict",
        "defaultdict",
        "Counter",
        "deque",
        "WeakKeyDictionary",
        "WeakValueDictionary",
        "WeakSet",
        "local",
    }
)
MUTABLE_NODES = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
CACHE_DECORATORS = frozenset({"lru_cache", "cache", "cached_property"})
FORBIDDEN = ("mmap", "httptools", "HttpToolsProtocol", "mallopt")


def _trees() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(encoding="utf-8"))) for path in MODULES]


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _is_mutable(value: ast.expr | None) -> bool:
    if isinstance(value, MUTABLE_NODES):
        return True
    return isinstance(value, ast.Call) and _name(value) in MUTABLE_CALLS


def _shared_state(body: list[ast.stmt]) -> list[tuple[int, str]]:
    found = []
    for node in body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign) and _is_mutable(node.value):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and _is_mutable(node.value):
            targets = [node.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        found += [(node.lineno, name) for name in names if name != "__all__"]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [
                (node.lineno, f"@{_name(d)} {node.name}")
                for d in node.decorator_list
                if _name(d) in CACHE_DECORATORS - {"cached_property"}
            ]
    return found


def test_no_class_over_300_lines_and_no_function_over_60() -> None:
    """A class stays under 300 lines and a function under 60 (docs/design.md §16)."""
    too_long = []
    for path, tree in _trees():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            if length > limit:
                too_long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} {length}")
    assert [] == too_long


def test_nothing_mutable_at_module_or_class_level() -> None:
    """A cache belongs to an object: no module- or class-level dict, list or set, no
    module-level lru_cache, no ``global`` (docs/design.md §16)."""
    shared = []
    for path, tree in _trees():
        where = path.relative_to(PACKAGE)
        shared += [f"{where}:{line} {name}" for line, name in _shared_state(tree.body)]
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                shared += [
                    f"{where}:{line} {node.name}.{name}" for line, name in _shared_state(node.body)
                ]
            elif isinstance(node, ast.Global):
                shared.append(f"{where}:{node.lineno} global {', '.join(node.names)}")
    assert [] == shared


@pytest.mark.parametrize("word", FORBIDDEN)
def test_no_private_file_formats_or_private_protocols(word: str) -> None:
    """No memory map of SQLite's -shm, no httptools protocol subclass, no mallopt (docs/design.md §16)."""
    assert [] == [
        str(p.relative_to(PACKAGE)) for p in MODULES if word in p.read_text(encoding="utf-8")
    ]


TESTS = Path(__file__).resolve().parent
ROOMS = sorted(  # the layers of the import contract: subpackages and the top-level modules
    p.stem for p in PACKAGE.iterdir() if (p / "__init__.py").exists() or p.suffix == ".py"
)


def _private_names() -> dict[str, set[str]]:
    """Each private name the package defines (``self._x = …``, ``def _x``, ``_X = …``) and the
    rooms that define it."""
    rooms: dict[str, set[str]] = {}
    for path, tree in _trees():
        room = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for node in ast.walk(tree):
            names = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.append(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.append(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.append(node.id)
            for name in names:
                if name.startswith("_") and not name.startswith("__"):
                    rooms.setdefault(name, set()).add(room)
    return rooms


def _private_reach(path: Path, room: str | None, owners: dict[str, set[str]]) -> list[str]:
    """Where a test file imports a private name of another room, or reads a private attribute
    that only other rooms define."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ragent_memory."):
            owner = (node.module or "").split(".")[1]
            found += [
                f"{path.name}:{node.lineno} imports {node.module}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and owner != room
            ]
        elif isinstance(node, ast.Attribute) and room not in owners.get(node.attr, {room}):
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if not own:  # a test helper's own state is its own
                found.append(f"{path.name}:{node.lineno} reads .{node.attr} of {owners[node.attr]}")
    return found


def test_tests_mirror_the_rooms_and_keep_out_of_other_rooms_privates() -> None:
    """Each room's tests live in tests/<room>/ (project-wide checks at the top), and no test
    imports another room's private names or reads a private attribute of another room's."""
    rooms = {p.parent.name for p in TESTS.glob("*/test_*.py")}
    assert rooms <= set(ROOMS), f"test folders that are not rooms: {rooms - set(ROOMS)}"
    owners = _private_names()
    reaches = []
    for path in sorted(TESTS.glob("**/test_*.py")):
        room = path.parent.name if path.parent != TESTS else None
        reaches += _private_reach(path, room, owners)
    assert [] == reaches
