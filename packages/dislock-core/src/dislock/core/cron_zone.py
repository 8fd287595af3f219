"""The time zone cron fires in, as dislock reads it: ``CRON_TZ``, else the host's
local zone (``TZ``, ``/etc/localtime``), by the name to show and record.

The name recorded with each run (IANA's when known) lets ``dislockctl missed`` read
a schedule as the machines read it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import timedelta, timezone, tzinfo
from typing import NamedTuple

from dislock.core.cron import UTC
from dislock.core.errors import ConfigurationError


class CronZone(NamedTuple):
    """A time zone to read cron expressions in, with the name to show and record."""

    tz: tzinfo
    name: str
    """An IANA name (``America/New_York``) when known, else a description."""
    source: str
    """Where it came from: ``CRON_TZ``, ``TZ``, ``/etc/localtime``, ``argument``..."""


ZONEINFO_DIRS = ("/usr/share/zoneinfo/", "/usr/lib/zoneinfo/", "/usr/share/lib/zoneinfo/")
LOCALTIME = "/etc/localtime"


def zone_name(tz: tzinfo) -> str:
    """The name to show for a ``tzinfo``: its IANA key, else its ``tzname``."""
    key = getattr(tz, "key", None)
    return key if isinstance(key, str) and key else str(tz.tzname(None) or tz)


def load_zone(value: object, *, name: str = "cron_tz", source: str = "argument") -> CronZone:
    """An IANA zone name (``Europe/Berlin``; ``:Europe/Berlin`` and a path under the
    zoneinfo directory too, as ``TZ`` allows) or a ``tzinfo``."""
    if isinstance(value, tzinfo):
        return CronZone(value, zone_name(value), source)
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"{name} must be an IANA time zone name like 'Europe/Berlin', got {value!r}"
        )
    key = value.strip().removeprefix(":")
    for directory in ZONEINFO_DIRS:
        if key.startswith(directory):
            key = key[len(directory) :]
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        if key.startswith("/"):  # a zone file by its path, as TZ allows (TZ=/etc/localtime)
            with open(key, "rb") as file:
                return CronZone(ZoneInfo.from_file(file, key=key), key, source)
        tz: tzinfo = ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        fixed = _posix_fixed_offset(key)
        if fixed is not None:
            return CronZone(fixed, key, source)
        # POSIX rules with daylight saving time (EST5EDT,M3.2.0,M11.1.0) are not
        # read: the IANA name says the same and is what the zone database keeps.
        raise ConfigurationError(
            f"{name}={value!r} is not a known IANA time zone (e.g. Europe/Berlin, "
            "America/New_York, UTC)"
        ) from None
    return CronZone(tz, key, source)


_IANA_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+-]{0,29}(?:/[A-Za-z][A-Za-z0-9_+-]{0,29}){0,2}")
"""A zone name of the tz database (``America/Argentina/Buenos_Aires``): no leading
``/``, no ``.`` or ``..``, nothing a path could hide behind."""


def recorded_zone(value: str) -> tzinfo:
    """A zone read from the run history (``cron_tz``), accepted only as an IANA name:
    any machine that may write the history chooses this text, so no path (a FIFO
    named there would block the reader), no ``:`` form, no POSIX rule."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    # Debian's database links "localtime" to /etc/localtime: the host's own zone,
    # outside the database, and not what the machine that recorded it meant.
    if len(value) <= 64 and _IANA_NAME.fullmatch(value) and value != "localtime":
        try:
            return ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            pass  # a directory of the database, or no such zone
    shown = value if len(value) <= 64 else value[:64] + "..."
    raise ConfigurationError(f"the recorded cron_tz {shown!r} is not an IANA time zone name")


_POSIX_FIXED = re.compile(
    r"(?:[A-Za-z]{3,}|<[A-Za-z0-9+-]{1,}>)([+-]?)(\d{1,2})(?::(\d{2}))?(?::(\d{2}))?"
)


def _posix_fixed_offset(text: str) -> tzinfo | None:
    """A POSIX ``TZ`` without daylight saving time (``UTC0``, ``JST-9``, ``<+0530>-5:30``)
    as a fixed offset; the offset counts hours west of Greenwich."""
    match = _POSIX_FIXED.fullmatch(text)
    if match is None:
        return None
    sign, hours, minutes, seconds = match.groups()
    west = timedelta(hours=int(hours), minutes=int(minutes or 0), seconds=int(seconds or 0))
    if west > timedelta(hours=24):
        return None
    return timezone(west if sign == "-" else -west, text)


def system_zone(localtime: str = LOCALTIME) -> CronZone:
    """The host's zone as the C library reads it without ``TZ``: ``/etc/localtime``
    (its link target names it), or UTC when there is none."""
    from zoneinfo import ZoneInfo

    try:
        target = os.path.realpath(localtime)
        for directory in ZONEINFO_DIRS:
            if target.startswith(directory):
                return load_zone(target[len(directory) :], name=localtime, source=localtime)
        with open(localtime, "rb") as file:  # a copy, not a link: it has no name
            return CronZone(ZoneInfo.from_file(file, key=localtime), localtime, localtime)
    except (OSError, ValueError, ConfigurationError):
        return CronZone(UTC, "UTC", f"no usable {localtime}")


def local_zone(environ: Mapping[str, str] | None = None) -> CronZone:
    """The host's local zone: ``TZ`` if set, else the system zone."""
    return _zone_in(environ, "TZ") or system_zone()


def cron_zone(environ: Mapping[str, str] | None = None) -> CronZone:
    """The zone cron reads a crontab in: ``CRON_TZ`` (cronie's variable) if set, else
    the host's local zone."""
    return _zone_in(environ, "CRON_TZ") or local_zone(environ)


def _zone_in(environ: Mapping[str, str] | None, variable: str) -> CronZone | None:
    value = (os.environ if environ is None else environ).get(variable, "").strip()
    return load_zone(value, name=variable, source=variable) if value else None
