"""Timestamps past what Python holds, as the readers load them: ``infinity``, a time
after the last day of 9999 or before February of year 1 becomes ``LATEST`` or ``EARLIEST``
(shown ``infinity``, ``-infinity``) instead of a ``DataError`` or an overflow that
would fail the whole view (security review #61, N6).  Registered on the
connections of ``dislockctl`` and ``serve`` only (``for_reading``): the lock path
never loads them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from psycopg import DataError
from psycopg.types.datetime import TimestamptzLoader

from dislock.core.dsn import learn_password
from dislock.core.pause import UNTIL_RESUMED

if TYPE_CHECKING:
    from psycopg import Connection

LATEST = UNTIL_RESUMED + timedelta(hours=1)
EARLIEST = datetime(1, 2, 1, tzinfo=timezone.utc)
"""Where far times are clamped to, inside Python's range, so that a reader's shift of
a time (a tolerance, a slot) cannot overflow: just after a pause without an end (which
the readers already shift safely), a month after the first."""


class _FarLoader(TimestamptzLoader):
    def load(self, data: Any) -> datetime:
        try:
            value = super().load(data)
        except DataError:  # past year 9999 or before year 1
            text = bytes(data)
            return EARLIEST if text.startswith(b"-") or text.endswith(b"BC") else LATEST
        return min(max(value, EARLIEST), LATEST)


def for_reading(conn: Connection[Any]) -> Connection[Any]:
    """``conn``, loading far timestamps as ``LATEST``/``EARLIEST``; the password it used
    is scrubbed from error text (``dsn.learn_password``)."""
    conn.adapters.register_loader("timestamptz", _FarLoader)
    learn_password(conn.info.password)
    return conn


def far(value: datetime) -> str | None:
    """``infinity`` or ``-infinity`` for a time loaded as ``LATEST`` or ``EARLIEST``."""
    if value >= LATEST:
        return "infinity"
    return "-infinity" if value <= EARLIEST else None


def iso(value: datetime) -> str:
    """``value`` in ISO 8601, or ``far``'s word for it."""
    return far(value) or value.isoformat()
