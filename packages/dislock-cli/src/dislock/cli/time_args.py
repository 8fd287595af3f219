"""The times and durations an operator gives ``dislockctl`` (``--since 24h``,
``--until 2099-12-01T06:00``), read into ``timedelta`` and aware ``datetime``."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from dislock.core.errors import ConfigurationError

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, *, name: str) -> timedelta:
    """``90s``, ``15m``, ``24h``, ``30d``, ``2w`` or a sum like ``1h30m``."""
    compact = text.strip().lower().replace(" ", "")
    if not compact or _DURATION.sub("", compact):
        raise ConfigurationError(
            f"{name} must be a duration like 90s, 15m, 24h, 30d or 1h30m, got {text!r}"
        )
    seconds = sum(float(n) * _UNITS[unit] for n, unit in _DURATION.findall(compact))
    if not 0 < seconds <= 100 * 365 * 86400:
        raise ConfigurationError(f"{name} must be more than 0 and at most 100 years, got {text!r}")
    return timedelta(seconds=seconds)


def parse_seconds(text: str, *, name: str) -> float:
    """A duration (``parse_duration``), or plain seconds (``3600``)."""
    stripped = text.strip()
    if stripped.replace(".", "", 1).isdigit():
        stripped += "s"
    return parse_duration(stripped, name=name).total_seconds()


def parse_time(text: str, *, name: str) -> datetime:
    """An ISO 8601 time; one without an offset is UTC."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigurationError(
            f"{name} must be an ISO 8601 time like 2099-12-01T06:00 or "
            f"2099-12-01T06:00+01:00, got {text!r}"
        ) from None
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
