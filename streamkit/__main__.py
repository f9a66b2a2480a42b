"""``python -m streamkit`` runs the command line."""

from streamkit.cli import main

raise SystemExit(main())
