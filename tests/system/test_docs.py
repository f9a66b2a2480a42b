"""Every code block in docs/ runs: each page's python blocks as one file, console blocks as commands.

A page's ```python blocks are one program: scripts/docs_examples.py writes them,
in order, into examples/docs/<page>.py as the body of one ``async def main()``,
and that file is what runs here, as a subprocess in a fresh temporary
directory, exactly as a reader runs it; the file must match its page. A block
tagged ```python no-run is shown but not run. A ```console block is a
transcript: each ``$ `` line is run by the shell (with the venv's ``streamkit``
on PATH) and the lines after it, up to the next ``$ ``, must equal what it
printed; a line ``...`` in the expected output matches any number of lines, and
an expected line ending in ``...`` matches any line with that beginning. A
transcript that starts a daemon in the background writes its pid to a ``*.pid``
file in the directory; whatever happens, that process is killed when the page
is done.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import ROOT

DOCS = ROOT / "docs"


def _load_docs_examples() -> Any:
    spec = importlib.util.spec_from_file_location(
        "docs_examples", ROOT / "scripts" / "docs_examples.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pages = _load_docs_examples()


def _page_id(page: Path) -> str:
    return str(page.relative_to(DOCS))


@pytest.mark.parametrize("page", pages.pages_with("python"), ids=_page_id)
def test_a_pages_runnable_file_matches_the_page_and_the_page_names_it(page: Path) -> None:
    """examples/docs/<page>.py is the page's blocks as they are now, and the page says how to run it."""
    path = pages.example_path(page)
    assert path.exists(), f"{path} is missing: run `python scripts/docs_examples.py`"
    assert path.read_text(encoding="utf-8") == pages.render(page), (
        f"{path.relative_to(ROOT)} no longer matches {_page_id(page)}: "
        "run `python scripts/docs_examples.py`"
    )
    command = f"python {path.relative_to(ROOT).as_posix()}"
    assert command in " ".join(page.read_text(encoding="utf-8").split()), (
        f"{_page_id(page)} does not tell its reader `{command}`"
    )


@pytest.mark.parametrize("page", pages.pages_with("python"), ids=_page_id)
def test_a_pages_python_runs_as_a_file(page: Path, tmp_path: Path) -> None:
    """`python examples/docs/<page>.py`, from an empty directory, runs the page's program to the end."""
    path = pages.example_path(page)
    done = subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, (
        f"`python {path.relative_to(ROOT)}` exited {done.returncode}:\n"
        + done.stdout[-4000:]
        + done.stderr[-8000:]
    )


def _expected_matches(expected: list[str], actual: list[str]) -> bool:
    if not expected:
        return not actual
    head, rest = expected[0], expected[1:]
    if head == "...":
        return any(_expected_matches(rest, actual[i:]) for i in range(len(actual) + 1))
    if not actual:
        return False
    if head == actual[0] or (head.endswith("...") and actual[0].startswith(head[:-3])):
        return _expected_matches(rest, actual[1:])
    return False


@pytest.mark.slow
@pytest.mark.parametrize("page", pages.pages_with("console"), ids=_page_id)
def test_console_blocks_run(page: Path, tmp_path: Path) -> None:
    """Each console transcript of the page prints what the page says, command by command."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["STREAMKIT_DOCS_TEST"] = "1"
    try:
        _run_transcripts(page, tmp_path, env)
    finally:
        # A transcript that starts a daemon in the background writes its pid to
        # a *.pid file; a failed step must not leave it running (and its port held).
        for pid_file in tmp_path.glob("*.pid"):
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)


def _run_transcripts(page: Path, tmp_path: Path, env: dict[str, str]) -> None:
    for info, source, line in pages.blocks(page):
        if not pages.is_run(info, "console"):
            continue
        steps: list[tuple[str, list[str]]] = []
        for text_line in source.splitlines():
            if text_line.startswith("$ "):
                steps.append((text_line[2:], []))
            elif steps:
                steps[-1][1].append(text_line.rstrip())
        for command, expected in steps:
            done = subprocess.run(
                command,
                shell=True,
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            actual = (done.stdout + done.stderr).rstrip("\n").splitlines()
            actual = [a.rstrip() for a in actual]
            while expected and expected[-1] == "":
                expected.pop()
            assert _expected_matches(expected, actual), (
                f"{page.name}:{line}: `{command}` printed:\n"
                + "\n".join(actual)
                + "\n\nbut the page shows:\n"
                + "\n".join(expected)
                + f"\n(exit code {done.returncode}; argv {shlex.split(command)!r})"
            )


def test_the_docs_describe_the_software_not_its_history() -> None:
    """No page names the project's internal issues or says it is under construction."""
    for page in sorted(DOCS.glob("**/*.md")):
        text = page.read_text(encoding="utf-8")
        for pattern in (r"\bissue \d+", r"\bissue's\b", r"under construction"):
            found = re.search(pattern, text, flags=re.IGNORECASE)
            assert found is None, (
                f"{_page_id(page)} says {found.group(0)!r}: the CHANGELOG is for history"
            )
