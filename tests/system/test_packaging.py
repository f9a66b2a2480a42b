"""The distribution's shape: import names, the wheel's contents, the console script."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support import ROOT


def _run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=False
    )


def test_mapped_packages_import_under_streamkit(tmp_path: Path) -> None:
    """processors/ and testing/ import as streamkit.processors and streamkit.testing."""
    done = _run_python("import streamkit.processors, streamkit.testing; print('ok')", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize("name", ["processors", "testing"])
def test_no_top_level_processors_or_testing_package(tmp_path: Path, name: str) -> None:
    """The install puts no top-level `processors` or `testing` package on the path."""
    done = _run_python(f"import {name}", cwd=tmp_path)
    assert done.returncode != 0
    assert "ModuleNotFoundError" in done.stderr


def test_console_script_runs() -> None:
    """The `streamkit` console script is installed and answers --help."""
    exe = Path(sys.executable).parent / "streamkit"
    done = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "usage: streamkit" in done.stdout


@pytest.mark.slow
def test_wheel_maps_packages_and_ships_py_typed(tmp_path: Path) -> None:
    """A built wheel holds streamkit/{processors,testing} and py.typed, and no top-level ones."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("streamkit_events-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "streamkit/py.typed" in names
    assert "streamkit/processors/__init__.py" in names
    assert "streamkit/testing/__init__.py" in names
    assert not [n for n in names if n.startswith(("processors/", "testing/"))]
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "streamkit = streamkit.cli:main" in text
    assert "streamkit = streamkit.testing.plugin" in text
