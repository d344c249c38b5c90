"""The closed sets of names: docs/design.md §16b lists each one and the type that defines it, and
the store's schema checks the same values the types allow."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

from ragent_memory.core import names
from ragent_memory.store import pg_schema, schema

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"


def _values(alias: Any) -> set[str]:
    """The strings a Literal alias (or a union of them) allows."""
    args = typing.get_args(alias)
    if typing.get_origin(alias) is typing.Literal:
        return set(args)
    return set().union(*(_values(a) for a in args))


def _rows() -> list[tuple[str, list[str], str]]:
    """(set, values as written, type path) of each row of the closed-sets table."""
    text = DESIGN.read_text(encoding="utf-8")
    section = text.split("## 16b. Closed sets", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[2].startswith("`") and cells[0] != "---":
            values = re.findall(r"`([^`]*)`", cells[1])
            rows.append((cells[0], values, cells[2].split()[0].strip("`")))
    return rows


def _resolve(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(_module(module), name)


ROWS = _rows()


def test_the_table_lists_every_set_core_names_defines() -> None:
    """Each Literal alias in core/names.py has its row in docs/design.md §16b."""
    defined = {
        f"core.names.{name}"
        for name, value in vars(names).items()
        if typing.get_origin(value) in (typing.Literal, typing.Union)
    }
    assert defined and defined <= {path for _, _, path in ROWS}


@pytest.mark.parametrize(("title", "written", "path"), ROWS, ids=[r[2] for r in ROWS])
def test_each_row_names_the_values_its_type_allows(
    title: str, written: list[str], path: str
) -> None:
    """A row's values are exactly its type's; a capitalised value is another set, expanded
    (looked up beside the type, then in core.names)."""
    home = path.rpartition(".")[0]
    expected: set[str] = set()
    for value in written:
        if value[:1].isupper():
            module = next(m for m in (home, "core.names") if hasattr(_module(m), value))
            expected |= _values(getattr(_module(module), value))
        else:
            expected.add("" if value == '""' else value)
    assert expected == _values(_resolve(path)), title


def _module(name: str) -> Any:
    return importlib.import_module(f"ragent_memory.{name}")


@pytest.mark.parametrize("source", [schema, pg_schema], ids=["sqlite", "postgres"])
@pytest.mark.parametrize(
    ("column", "alias"),
    [("status", names.AuditStatus), ("kind", names.MemoryKind), ("status", names.MemoryStatus)],
)
def test_the_schema_checks_the_values_the_types_allow(source: Any, column: str, alias: Any) -> None:
    """Each CHECK (column IN (...)) the schema holds for a typed column lists its type's values."""
    text = Path(source.__file__).read_text(encoding="utf-8")
    checks = re.findall(rf"CHECK \({column} IN \(([^)]*)\)\)", text)
    allowed = [set(re.findall(r"'([^']*)'", c)) for c in checks]
    assert _values(alias) in allowed


def test_the_compaction_section_explains_every_skip_reason() -> None:
    """docs/design.md §5's table of skip reasons covers SkipReason but ``applied`` (explained
    in its note)."""
    text = DESIGN.read_text(encoding="utf-8")
    section = text.split("**Why a due compaction did not apply**", 1)[1].split("\n\n", 2)[1]
    explained = set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))
    assert _values(names.SkipReason) - {"applied"} == explained


MISSPELT = """
from ragent_memory import TurnReport
from ragent_memory.core.records import AuditRow, Substitution


def misspelt(report: TurnReport) -> bool:
    AuditRow(session_id="s", generation=1, status="aplied")
    Substitution("k", "trimm", "r", {})
    return report.skipped_reason == "timout"
"""


def test_mypy_refuses_a_misspelt_name_where_it_is_made_or_compared(tmp_path: Path) -> None:
    """A misspelt audit status, substitution kind or skip reason is a type error (the package's
    own mypy settings: strict, so equality is checked too)."""
    source = tmp_path / "misspelt.py"
    source.write_text(MISSPELT, encoding="utf-8")
    command = [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache")]
    done = subprocess.run(
        [*command, str(source)], capture_output=True, text=True, timeout=600, check=False
    )
    lines = [line for line in done.stdout.splitlines() if ": error: " in line]
    assert [7, 8, 9] == [int(line.split(":")[1]) for line in lines], done.stdout
    assert ["'aplied'", "'trimm'", "'timout'"] == [
        re.findall(r"'(?:aplied|trimm|timout)'", line)[0] for line in lines
    ]
