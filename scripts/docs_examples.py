"""Writes each docs page's Python as one runnable file: examples/docs/<page>.py.

The ```python blocks of a page are one program, read top to bottom, with
``await`` allowed at the top level of a block. Python accepts that only in its
asyncio REPL, where pasting a block with blank lines breaks it, so each page also
exists as a plain file: the blocks, in order, as the body of one
``async def main()`` run by ``asyncio.run``. ``python examples/docs/tutorial.py``
runs the tutorial. The test suite runs every such file in a fresh directory and
fails when a file no longer matches its page; ``python scripts/docs_examples.py``
rewrites them all. A block tagged ```python no-run is shown on the page only.

Because the blocks share one function body, a page never rebinds a name from
inside a function of its own (``global`` would reach past ``main``): it keeps
changing state in an object instead.
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
OUT = ROOT / "examples" / "docs"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def blocks(page: Path) -> list[tuple[str, str, int]]:
    """The fenced blocks of a page: (info string, body, line of the body's first line)."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 2
        found.append((match.group(1).strip(), match.group(2), line))
    return found


def is_run(info: str, kind: str) -> bool:
    """Whether a block of this info string is a ``kind`` block the tests run."""
    words = info.split()
    return words[:1] == [kind] and "no-run" not in words[1:]


def pages_with(kind: str) -> list[Path]:
    """The docs pages with at least one block of ``kind`` that runs."""
    pages = sorted(DOCS.glob("**/*.md")) if DOCS.exists() else []
    return [p for p in pages if any(is_run(info, kind) for info, _, _ in blocks(p))]


def example_path(page: Path) -> Path:
    """Where a page's runnable file lives."""
    return OUT / (page.relative_to(DOCS).with_suffix("").as_posix().replace("/", "_") + ".py")


def render(page: Path) -> str:
    """The page's Python blocks as one runnable file."""
    name = page.relative_to(ROOT).as_posix()
    parts = [
        f'"""The code of {name}, block by block, as one program.\n\n'
        f"Generated from the page by scripts/docs_examples.py; do not edit. Run it\n"
        f"from any directory (it writes its files there):\n\n"
        f"    python {example_path(page).relative_to(ROOT).as_posix()}\n"
        f'"""\n\n'
        "import asyncio\n\n\n"
        "async def main() -> None:\n"
    ]
    for info, source, line in blocks(page):
        if not is_run(info, "python"):
            continue
        _refuse_indent_sensitive_strings(source, f"{name}:{line}")
        parts.append(f"    # --- {name}:{line}\n")
        parts.append(textwrap.indent(source, "    ", lambda text: bool(text.strip())))
    parts.append('\n\nif __name__ == "__main__":\n    asyncio.run(main())\n')
    return "".join(parts)


def _refuse_indent_sensitive_strings(source: str, where: str) -> None:
    """Indenting a block into ``main`` must not change what it does: no string spans lines.

    A docstring may (indenting it changes nothing a program sees); any other
    string literal over several lines would gain four spaces per line.
    """
    tree = ast.parse(source)
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant | ast.JoinedStr)
            and node.lineno != node.end_lineno
            and id(node) not in docstrings
        ):
            raise SystemExit(
                f"{where}: a string literal spans lines {node.lineno}-{node.end_lineno} "
                "of the block; indenting it into main() would change it. Build it with "
                "\\n or textwrap.dedent instead."
            )


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    wanted = {example_path(page): render(page) for page in pages_with("python")}
    for stale in set(OUT.glob("*.py")) - set(wanted):
        stale.unlink()
        print(f"removed {stale.relative_to(ROOT)}")
    for path, text in sorted(wanted.items()):
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
