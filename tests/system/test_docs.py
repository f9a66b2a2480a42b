"""Every code block in docs/ runs: python blocks in order per page, console blocks as commands.

A ```python block runs in one namespace shared by the blocks of its page, in a
fresh temporary directory, with top-level ``await`` allowed; a block tagged
```python no-run is shown but not run. A ```console block is a transcript:
each ``$ `` line is run by the shell (with the venv's ``streamkit`` on PATH)
and the lines after it, up to the next ``$ ``, must equal what it printed; a
line ``...`` in the expected output matches any number of lines, and an
expected line ending in ``...`` matches any line with that beginning. A
transcript that starts a daemon in the background writes its pid to a
``*.pid`` file in the directory; whatever happens, that process is killed
when the page is done.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
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
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def _blocks(page: Path) -> list[tuple[str, str, int]]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        info = match.group(1).strip()
        line = text.count("\n", 0, match.start()) + 2
        found.append((info, match.group(2), line))
    return found


def _pages_with(kind: str) -> list[Path]:
    pages = sorted(DOCS.glob("**/*.md")) if DOCS.exists() else []
    return [p for p in pages if any(info.split()[:1] == [kind] for info, _, _ in _blocks(p))]


def _page_id(page: Path) -> str:
    return str(page.relative_to(DOCS))


@pytest.mark.parametrize("page", _pages_with("python"), ids=_page_id)
async def test_python_blocks_run(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each python block of the page runs, in order, in one namespace, without raising."""
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    for info, source, line in _blocks(page):
        words = info.split()
        if words[:1] != ["python"] or "no-run" in words[1:]:
            continue
        # Pad so tracebacks point at the line of the Markdown file itself.
        code = compile(
            "\n" * (line - 1) + source,
            str(page),
            "exec",
            flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
            dont_inherit=True,
        )
        result = eval(code, namespace)
        if inspect.iscoroutine(result):
            await result


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


@pytest.mark.parametrize("page", _pages_with("console"), ids=_page_id)
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
    for info, source, line in _blocks(page):
        if info.split()[:1] != ["console"] or "no-run" in info.split()[1:]:
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
