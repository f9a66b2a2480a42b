"""The retention worker process: prepares the chunks its parent sends, one at a time.

Started by :class:`streamkit.backends._retention.chunk_prep.ProcessPreparer` as
``python -m streamkit.backends._retention.chunk_worker``. It reads requests from its
standard input (``(opener, rows, ask)``, see
:func:`~streamkit.backends._retention.chunk_prep.read_and_prepare`) and answers each
on its standard output, ``("ok", Prepared)`` or ``("error", (kind, words))``
for a chunk that could not be read or written; it leaves when its input
ends, which is when its parent closes the pipe or dies. The pipe is
private to the two processes, so its pickles come only from the parent.

It runs at a lower CPU priority than its parent (:data:`NICENESS` more):
its work is background work, and on a machine with few CPUs the host's
event loop answering appends must not wait for it. Measured beside 100
appends a second (docs/performance.md), appends that overlapped a chunk's
preparation were slow less than half as often with it.
"""

from __future__ import annotations

import os
import sqlite3
import sys

from streamkit.backends._retention.chunk_prep import read_and_prepare, read_message, write_message

NICENESS = 10
"""How much lower than its parent's the worker's CPU priority is (``nice``)."""


def main() -> None:
    # Raising one's own niceness needs no privilege; it only ever yields the CPU.
    os.nice(NICENESS)
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not land in the middle of an answer
    while True:
        try:
            opener, rows, ask = read_message(requests)
        except EOFError:
            return
        try:
            answer: tuple[str, object] = ("ok", read_and_prepare(opener, rows, ask))
        except (OSError, sqlite3.Error, ValueError) as exc:
            kind = "ValueError" if isinstance(exc, ValueError) else "OSError"
            answer = ("error", (kind, str(exc)))
        write_message(answers, answer)


if __name__ == "__main__":
    main()
