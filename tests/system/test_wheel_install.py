"""The built distributions install like any package: from outside the repository, in fresh venvs.

The wheel and the sdist are built from the checkout (``python -m build``),
and each is installed with every extra (``web``, ``postgres``, ``webhook``,
``schedules``, ``testing``) into a venv of its own, made for the test, whose working
directory is a temporary folder: nothing of the repository is importable
there. Then every module of
the installed ``streamkit`` is imported, ``streamkit --version`` answers,
``py.typed`` and the admin page's files are in place, and a tiny host runs a
processor defined in that folder: an append through the CLI reaches it, and
SIGTERM stops it cleanly. The package list in ``pyproject.toml`` is checked
against the folders of the tree, so a new package cannot be left out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT

PROCESSOR = """
from pydantic import BaseModel
from streamkit import StreamProcessor, define_processor_contract


class Count(BaseModel):
    n: int = 0


class Counter(StreamProcessor[Count]):
    contract = define_processor_contract(
        slug="count", version="1", state_schema=Count, consumes=["tick"]
    )

    def reduce(self, event, state):
        return Count(n=state.n + 1)
"""

# Run inside the installed venv: imports every module of the distribution.
IMPORT_ALL = """
import importlib, json, pkgutil, sys
import streamkit
names = sorted(m.name for m in pkgutil.walk_packages(streamkit.__path__, "streamkit."))
for name in names:
    if name.endswith(".__main__"):
        continue  # (a script: importing it runs the CLI)
    importlib.import_module(name)
print(json.dumps({"file": streamkit.__file__, "modules": names}))
"""


def _mapped_packages() -> dict[str, Path]:
    """Every package the tree holds, by the import name it must install under."""
    roots = {"streamkit": ROOT / "streamkit", "streamkit.processors": ROOT / "processors"}
    roots["streamkit.testing"] = ROOT / "testing"
    found: dict[str, Path] = {}
    for prefix, folder in roots.items():
        for init in folder.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            relative = init.parent.relative_to(folder).parts
            found[".".join((prefix, *relative))] = init.parent
    return found


def test_the_package_list_names_every_package_of_the_tree() -> None:
    """pyproject.toml's hand-kept list holds every folder with an ``__init__.py``, and no more."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    in_tree = set(_mapped_packages())
    assert sorted(in_tree - listed) == [], "missing from pyproject.toml's packages"
    assert sorted(listed - in_tree) == [], "listed in pyproject.toml but not in the tree"


def test_the_version_has_one_home() -> None:
    """The distribution's version is read from ``streamkit._version``, not written twice."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in config["project"]
    assert config["project"]["dynamic"] == ["version"]
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "streamkit._version.__version__"
    }
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


@pytest.fixture(scope="module")
def built() -> Iterator[dict[str, Path]]:
    """The wheel and the sdist, built once from the checkout into a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="skdist") as out:
        done = subprocess.run(
            [sys.executable, "-m", "build", "--wheel", "--sdist", "--outdir", out, str(ROOT)],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        (wheel,) = Path(out).glob("streamkit_events-*.whl")
        (sdist,) = Path(out).glob("streamkit_events-*.tar.gz")
        yield {"wheel": wheel, "sdist": sdist}


def _venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=300)
    return where / "bin"


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=timeout
    )
    assert done.returncode == 0, f"{argv}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_an_installed_distribution_works_from_outside_the_repository(
    built: dict[str, Path], kind: str, tmp_path: Path
) -> None:
    """Install with extras into a fresh venv; import everything, run the CLI and a tiny host."""
    bin_dir = _venv(tmp_path / "venv")
    work = tmp_path / "work"
    work.mkdir()
    # Nothing of the checkout on the path: only what the venv installed.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    pip = [str(bin_dir / "python"), "-m", "pip", "-q", "--disable-pip-version-check"]
    extras = "web,postgres,webhook,schedules,testing"  # every extra a user may ask for
    _run([*pip, "install", f"{built[kind]}[{extras}]"], work, env, timeout=900)

    found = json.loads(_run([str(bin_dir / "python"), "-c", IMPORT_ALL], work, env))
    installed = Path(found["file"]).parent
    assert installed.is_relative_to(tmp_path / "venv"), installed
    expected = set(_mapped_packages()) - {"streamkit"}  # (the walk lists what is below it)
    assert expected <= set(found["modules"]), sorted(expected - set(found["modules"]))
    assert "streamkit.config._settings" in found["modules"]
    assert (installed / "py.typed").is_file()
    for name in ("index.html", "admin.js", "admin.css"):
        assert (installed / "web" / "static" / name).is_file(), name
    assert not (installed.parent / "processors").exists()
    assert not (installed.parent / "testing").exists()

    streamkit = str(bin_dir / "streamkit")
    assert _run([streamkit, "--version"], work, env).startswith("streamkit ")

    (work / "counting.py").write_text(PROCESSOR)
    host_env = {**env, "PYTHONPATH": str(work)}
    db = work / "app.db"
    log = work / "host.log"
    with log.open("wb") as out:  # the child keeps its own copy
        host = subprocess.Popen(
            [streamkit, "host", "--db", str(db), "--processor", "counting:Counter"],
            cwd=work,
            env=host_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not Path(f"{db}.sock").exists():
            assert host.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the host did not open its control socket"
            time.sleep(0.05)
        _run([streamkit, "append", "--db", str(db), "tick"], work, host_env)
        count = 0
        while count < 1:
            assert time.monotonic() < deadline, "the processor never counted the event"
            snapshot = json.loads(
                _run([streamkit, "snapshot", "count", "--db", str(db), "--json"], work, host_env)
            )
            count = snapshot["state"]["n"]
            time.sleep(0.05)
    finally:
        host.send_signal(signal.SIGTERM)
        code = host.wait(60)
    assert code == 0, log.read_text()
    assert "host.stopped" in log.read_text()
