"""UTC timestamps as sandbench writes them in every file: ISO 8601, to the second, Z suffix."""

from __future__ import annotations

import datetime as dt

STAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def utc_now() -> str:
    """The current UTC time in the one format (``2026-12-04T08:15:00Z``)."""
    return dt.datetime.now(dt.UTC).strftime(STAMP_FORMAT)
