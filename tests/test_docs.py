"""The README stays a front door and the docs site stays whole."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import yaml
from sessions import ROOT


class _MkdocsLoader(yaml.SafeLoader):
    """mkdocs.yml names Python objects (``!!python/name:``); the nav needs none of them."""


_MkdocsLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)


def _nav_pages(nav: list[Any]) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_readme_is_short_and_quotes_no_timings() -> None:
    """The README fits in 250 lines and leaves measured times to docs/benchmarks.md."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    assert [] == re.findall(r"\d\s*(?:ms|µs)\b", text)


def test_readme_links_resolve() -> None:
    """Every relative link of the README names a file of the repository."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)#]+[^)]*)\)", text)]
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert [] == missing


def test_every_page_is_in_the_nav() -> None:
    """Each docs/*.md is in mkdocs.yml's nav, and each nav entry is a page that exists."""
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), _MkdocsLoader)
    nav = sorted(_nav_pages(config["nav"]))
    assert sorted(p.name for p in (ROOT / "docs").glob("*.md")) == nav


def test_benchmarks_page_is_made_from_the_results() -> None:
    """docs/benchmarks.md is what ``python -m benchmarks.report`` makes of benchmarks/results/."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.report", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert 0 == done.returncode, done.stderr


def test_the_make_targets_the_docs_name_exist() -> None:
    """``make demo``, ``make test``, ``make docs`` and ``make bench`` are Makefile targets."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert {"demo", "test", "docs", "bench"} <= set(re.findall(r"^([a-z]+):", makefile, re.M))


def test_architecture_lists_every_module() -> None:
    """docs/architecture.md has a line for every module of the package and for none that is gone."""
    package = ROOT / "ragent_memory"
    modules = {
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "__init__.py" or path.parent == package
    }
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(?:ragent_memory/)?([\w/]+\.py)` \|", page, re.M))
    assert set() == modules - listed
    assert set() == {name for name in listed if not (package / name).exists()}
