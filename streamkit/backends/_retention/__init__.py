"""Retention, whatever the backend: one package for what takes a log's history away.

Each module holds one rule, over the rows a backend supplies
(:class:`~streamkit.backends._retention.cuts.TruncationRows`):

- :mod:`.rules`: horizons, holds, forgetting a processor;
- :mod:`.key_windows`: how long the keys of taken events answer;
- :mod:`.segments`: the archive's files, their proof and their reads;
- :mod:`.chunk_prep` and :mod:`.chunk_worker`: a chunk read (and archived)
  off the event loop, in a worker process or a thread;
- :mod:`.cuts`: what one chunk's transaction writes, and what it checks first;
- :mod:`.archive_files`: segment files no row records, and the archive's check;
- :mod:`.run`: a retention run, phase by phase;
- :mod:`.verbs`: the one part a host store holds, which calls them.

Private to ``streamkit.backends``: the SQLite and PostgreSQL packages supply
the rows, the host store builds the part, nothing above reaches in.
"""
