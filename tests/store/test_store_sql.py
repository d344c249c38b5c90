"""Each store statement is a named constant written in both dialects: SQLite's text with ``?``
placeholders, PostgreSQL's with ``%s``, the same parameters in each (nothing is rewritten when
a statement runs)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator, Mapping
from typing import Any

import ragent_memory.store
from ragent_memory.store.base import Sql

_PG_MARK = re.compile(r"%s")
# Statements whose parameters differ by backend, on purpose.
DIFFERENT = {"recall_index.INSERT_TERMS[0]": "a PostgreSQL row also holds its keys"}


def named(value: Any) -> Iterator[Sql]:
    """The statements a module constant holds (itself, or within tuples and mappings)."""
    if isinstance(value, Sql):
        yield value
    elif isinstance(value, tuple):
        for item in value:
            yield from named(item)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from named(item)


def statements() -> dict[str, Sql]:
    found = {}
    for info in pkgutil.iter_modules(ragent_memory.store.__path__):
        module = importlib.import_module(f"ragent_memory.store.{info.name}")
        for name, value in vars(module).items():
            for number, sql in enumerate(named(value)):
                found[f"{info.name}.{name}[{number}]"] = sql
    return found


def test_every_statement_has_the_same_parameters_in_both_dialects() -> None:
    """SQLite's text uses only ``?``, PostgreSQL's only ``%s``, as many of each."""
    found = statements()
    assert len(found) > 100  # the store's statements, not a few
    for name, sql in found.items():
        assert "%s" not in sql.sqlite, name
        assert "?" not in sql.postgres, name
        if sql.sqlite and sql.postgres and name not in DIFFERENT:  # (one backend's: one text)
            assert sql.sqlite.count("?") == len(_PG_MARK.findall(sql.postgres)), name
