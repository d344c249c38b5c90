"""What a user gets from ``pip install .``: a version, a license, the default config, ``init``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from sessions import ROOT

import ragent_memory


def _run(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel pip builds from this checkout, and what pip printed while building it."""
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"  # pip builds in the source tree: keep build/ out of the checkout
    junk = shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "demo-out", "*.db*")
    shutil.copytree(ROOT, source, symlinks=True, ignore=junk)
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", out, source)
    assert 0 == built.returncode, built.stderr
    (path,) = out.glob("ragent_memory-*.whl")
    return path, built.stdout + built.stderr


def test_version_comes_from_the_package_metadata() -> None:
    """``ragent_memory.__version__`` is the installed distribution's version."""
    from importlib.metadata import version

    assert version("ragent-memory") == ragent_memory.__version__


@pytest.mark.slow
def test_build_prints_no_deprecation_warning(wheel: tuple[Path, str]) -> None:
    """The build backend has nothing to complain about (license as an SPDX expression)."""
    _path, output = wheel
    assert "deprecat" not in output.lower()
    assert "BuildBackendWarning" not in output


@pytest.mark.slow
def test_wheel_ships_license_and_default_config(wheel: tuple[Path, str]) -> None:
    """The wheel carries LICENSE, an SPDX license expression and the documented config."""
    path, _output = wheel
    with zipfile.ZipFile(path) as whl:
        names = whl.namelist()
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        assert "License-Expression: Apache-2.0" in whl.read(metadata).decode()
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
        shipped = whl.read("ragent_memory/data/ragent-memory.yaml")
    assert (ROOT / "config" / "ragent-memory.yaml").read_bytes() == shipped


def test_wheel_ships_the_audit_page_templates(wheel: tuple[Path, str]) -> None:
    """Every template of the audit page is in the wheel, byte for byte."""
    path, _output = wheel
    folder = ROOT / "ragent_memory" / "ui" / "templates"
    with zipfile.ZipFile(path) as whl:
        shipped = {
            name.rsplit("/", 1)[1]: whl.read(name)
            for name in whl.namelist()
            if name.startswith("ragent_memory/ui/templates/")
        }
    assert {p.name: p.read_bytes() for p in folder.glob("*.html")} == shipped


@pytest.mark.slow
def test_fresh_venv_install_has_version_and_init(wheel: tuple[Path, str], tmp_path: Path) -> None:
    """In a fresh venv: ``__version__`` is set and ``ragent-memory init`` writes the config."""
    path, _output = wheel
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    installed = _run(env / "bin" / "python", "-m", "pip", "install", "--quiet", path)
    assert 0 == installed.returncode, installed.stderr
    shown = _run(
        env / "bin" / "python", "-c", "import ragent_memory; print(ragent_memory.__version__)"
    )
    assert ragent_memory.__version__ == shown.stdout.strip()
    work = tmp_path / "project"
    work.mkdir()
    init = _run(env / "bin" / "ragent-memory", "init", cwd=work)
    assert 0 == init.returncode, init.stderr
    written = work / "config" / "ragent-memory.yaml"
    assert (ROOT / "config" / "ragent-memory.yaml").read_text() == written.read_text()
    inspected = _run(env / "bin" / "ragent-memory", "inspect", "--json", cwd=work)
    assert 0 == inspected.returncode, inspected.stderr
    assert '"context_window_chars": 1200000' in inspected.stdout
