"""``python -m streamkit`` runs the command line."""

from streamkit.cli._main import main

raise SystemExit(main())
