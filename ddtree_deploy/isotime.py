"""Times as the tool's JSON says them: ISO-8601 text in UTC with its offset
(`2026-12-03T15:04:05.123+00:00`), never seconds since the epoch. Files written by older
versions (saved plans, facts, payload states) may hold epoch numbers: `epoch` reads both."""

from __future__ import annotations

import datetime
from typing import Any


def iso_time(epoch_s: float) -> str:
    """Seconds since the epoch as ISO-8601 in UTC (milliseconds)."""
    return datetime.datetime.fromtimestamp(epoch_s, datetime.UTC).isoformat(
        timespec="milliseconds")


def epoch(value: Any) -> float:
    """A time read back: ISO-8601 text (this version's) or seconds since the epoch (older)."""
    if isinstance(value, str):
        return datetime.datetime.fromisoformat(value).timestamp()
    return float(value)


def utc_iso(value: Any) -> Any:
    """A time of the tool's records as ISO-8601 in UTC: seconds since the epoch, or a text
    with an offset (`2026-12-03T16:04:05+0100`, as the host-side scripts write it). Anything
    else (None, a text that is no time, a bool) is given back as it is."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return iso_time(float(value))
    if isinstance(value, str):
        try:
            when = datetime.datetime.fromisoformat(value)
        except ValueError:
            return value
        if when.tzinfo is None:  # no offset: which zone it meant is unknown; kept as written
            return value
        return when.astimezone(datetime.UTC).isoformat(
            timespec="milliseconds" if when.microsecond else "seconds")
    return value
