"""The README's example and the adapter examples of the docs run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from sessions import ROOT


def _python_blocks(page: str) -> list[str]:
    text = (ROOT / page).read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_readme_example_prints_what_the_readme_says(tmp_path: Path) -> None:
    """The README's first example runs offline and prints the output shown under it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    example = re.search(r"```python\n(.*?)```\s*It prints:\s*```text\n(.*?)```", text, re.S)
    assert example is not None
    block, shown = example.groups()
    done = subprocess.run(
        [sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert 0 == done.returncode, done.stderr
    assert shown == done.stdout


def test_pydantic_ai_example_runs_as_written(tmp_path: Path) -> None:
    """The pydantic-ai example (TestModel, ``"test"``) runs offline; the recall tool answers."""
    (block,) = [b for b in _python_blocks("docs/adapters.md") if "integrations.pydantic_ai" in b]
    assert len(block.splitlines()) <= 15
    done = subprocess.run(
        [sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert 0 == done.returncode, done.stderr
    assert "recall_tool_result" in done.stdout


def test_adapter_examples_are_short() -> None:
    """Every adapter example fits in 15 lines."""
    blocks = [b for b in _python_blocks("docs/adapters.md") if "ragent_memory.integrations." in b]
    assert 3 == len(blocks)
    assert all(len(b.splitlines()) <= 15 for b in blocks)
