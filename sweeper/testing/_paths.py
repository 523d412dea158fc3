"""Where the tests find the checkout's own files (search spaces, fixtures, scripts run in side environments)."""

from __future__ import annotations

from pathlib import Path

#: The source checkout this ``sweeper`` was imported from: the tests run from an editable install (``make test``).
REPO = Path(__file__).resolve().parents[2]
