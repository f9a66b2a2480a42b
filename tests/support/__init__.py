"""What the tests share: processors, rigs, peers and child programs (one home each)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root."""
SUPPORT = Path(__file__).resolve().parent
"""This folder (child programs and modules copied into a test's directory live here)."""
