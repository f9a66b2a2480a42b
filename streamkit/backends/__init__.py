"""Storage backends: each package implements the protocols of :mod:`streamkit.protocols`."""
