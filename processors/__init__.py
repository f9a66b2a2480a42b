"""First-party processors (imported as ``streamkit.processors``), built only on streamkit's public API."""
