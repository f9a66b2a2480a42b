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

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ROOT


def readme_host_example() -> tuple[str, list[str], list[str], list[str]]:
    """The README's host example: its ``orders.py``, the host's, the append's and the
    snapshot's command lines, exactly as a reader copies them."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Running processors", 1)[1].split("\n## ", 1)[0]
    (module,) = re.findall(r"```python\n(.*?)```", section, re.S)
    (host,) = re.findall(r"^PYTHONPATH=\. (streamkit host .*)$", section, re.M)
    (append,) = re.findall(r"`(streamkit append [^`]+)`", section)
    (snapshot,) = re.findall(r"`(streamkit snapshot [^`]+)`", section)
    return module, shlex.split(host), shlex.split(append), shlex.split(snapshot)


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


@contextlib.contextmanager
def _host(argv: list[str], work: Path, env: dict[str, str], db: Path) -> Iterator[Path]:
    """``streamkit host`` started in ``work``, up once its socket is; its log file.

    Stopped with SIGTERM at the end, which must end it cleanly (``host.stopped``).
    """
    log = work / "host.log"
    with log.open("wb") as out:  # the child keeps its own copy
        host = subprocess.Popen(argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not Path(f"{db}.sock").exists():
            assert host.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the host did not open its control socket"
            time.sleep(0.05)
        yield log
    finally:
        host.send_signal(signal.SIGTERM)
        code = host.wait(60)
    assert code == 0, log.read_text()
    assert "host.stopped" in log.read_text()


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=timeout
    )
    assert done.returncode == 0, f"{argv}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.xdist_group("built")  # one worker builds the distributions once for all three
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

    # The README's host example, as a reader with the wheel only runs it.
    module, host_argv, append_argv, snapshot_argv = readme_host_example()
    (work / "orders.py").write_text(module)
    host_env = {**env, "PYTHONPATH": "."}
    db = work / "app.db"
    with _host([streamkit, *host_argv[1:]], work, host_env, db):
        deadline = time.monotonic() + 60
        _run([streamkit, *append_argv[1:]], work, host_env)
        book: dict[str, Any] = {}
        while book.get("placed") != 1:
            assert time.monotonic() < deadline, "the processor never counted the event"
            snapshot = json.loads(_run([streamkit, *snapshot_argv[1:], "--json"], work, host_env))
            book = snapshot["state"]
            time.sleep(0.05)
        assert book == {"placed": 1, "total": 9.5}


def tutorial_last_step() -> tuple[str, str, list[list[str]]]:
    """The tutorial's last step: its ``taskboard.py``, its ``streamkit.toml`` and its
    commands (``$`` lines, continuations joined), as a reader copies them."""
    text = (ROOT / "docs" / "tutorial.md").read_text()
    section = text.split("## 9. Run it in the host", 1)[1].split("\n## ", 1)[0]
    (module,) = re.findall(r"```python no-run\n(.*?)```", section, re.S)
    (config,) = re.findall(r"```toml\n(.*?)```", section, re.S)
    console = re.findall(r"```console no-run\n(.*?)```", section, re.S)[0]
    joined = console.replace("\\\n", " ")
    commands = [shlex.split(line[2:]) for line in joined.splitlines() if line.startswith("$ ")]
    return module, config, commands


@pytest.mark.slow
@pytest.mark.xdist_group("built")
def test_the_tutorial_s_last_step_runs_from_the_installed_wheel(
    built: dict[str, Path], tmp_path: Path
) -> None:
    """The board and handler of the tutorial, run by ``streamkit host`` from the wheel alone:
    a requested task is created and on the board; one without a title is dead-lettered."""
    bin_dir = _venv(tmp_path / "venv")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    pip = [str(bin_dir / "python"), "-m", "pip", "-q", "--disable-pip-version-check"]
    _run([*pip, "install", str(built["wheel"])], work, env, timeout=900)
    module, config, commands = tutorial_last_step()
    (work / "taskboard.py").write_text(module)
    (work / "streamkit.toml").write_text(config)
    host_argv, append_argv, *shown = commands
    assert host_argv[:2] == ["PYTHONPATH=.", "streamkit"]
    streamkit = str(bin_dir / "streamkit")
    host_env = {**env, "PYTHONPATH": "."}
    db = work / "tasks.db"
    with _host([streamkit, *host_argv[2:]], work, host_env, db):
        deadline = time.monotonic() + 60
        _run([streamkit, *append_argv[1:]], work, host_env)
        untitled = '{"task_id": "t2", "name": "create-task", "args": {"category": "work"}}'
        _run(
            [streamkit, "append", "--db", "tasks.db", "task.requested", "--payload", untitled],
            work,
            host_env,
        )
        snapshot = next(argv for argv in shown if argv[1] == "snapshot")
        board: dict[str, Any] = {}
        while board.get("done") != {"home": 1} or board.get("dead_lettered") != {"work": 1}:
            assert time.monotonic() < deadline, f"the board never showed both: {board}"
            board = json.loads(_run([streamkit, *snapshot[1:], "--json"], work, host_env))["state"]
            time.sleep(0.1)
        assert board["recent"] == [{"task_id": "t1", "title": "Mop", "category": "home"}]
        tasks = next(argv for argv in shown if argv[1:3] == ["tasks", "list"])
        _run([streamkit, *tasks[1:]], work, host_env)
        dlq = next(argv for argv in shown if argv[1:3] == ["dlq", "list"])
        assert "t2" in _run([streamkit, *dlq[1:]], work, host_env)
