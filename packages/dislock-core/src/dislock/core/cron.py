"""Cron expressions and schedule slots.

A schedule lock's row expires at the next cron boundary, computed from the
database's clock rather than the local one, so machines with skewed clocks agree
on which slot they are in.  Boundaries are computed in UTC so that sessions with
different ``TimeZone`` settings compute the same slot.
"""

from __future__ import annotations

from datetime import datetime, timezone

from dislock.core.errors import ConfigurationError

EARLY_FIRE_TOLERANCE = 1.0
"""A start this close before a boundary (at most a quarter of a slot) belongs to the
slot that boundary opens: cron on a host whose clock runs a little ahead of the
database's fires just before the boundary, by the database's clock."""


def check_cron(expression: object, *, name: str = "schedule") -> str:
    """A cron expression croniter accepts (5 fields, or 6 with seconds)."""
    from croniter import croniter  # only schedule users pay for importing croniter

    if not isinstance(expression, str) or not expression.strip():
        raise ConfigurationError(f"{name} must be a cron expression, got {expression!r}")
    if not croniter.is_valid(expression.strip()):
        raise ConfigurationError(f"{name} is not a valid cron expression: {expression!r}")
    return expression.strip()


def next_boundary(expression: str, now: datetime) -> datetime:
    """The first cron boundary strictly after ``now`` (an aware datetime), in UTC."""
    from croniter import croniter

    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    start = now.astimezone(timezone.utc)
    boundary = croniter(check_cron(expression), start).get_next(datetime)
    if not isinstance(boundary, datetime):  # croniter's return type is loose
        raise TypeError(f"croniter returned {boundary!r}")
    return boundary.astimezone(timezone.utc)


def slot_end(expression: str, now: datetime) -> datetime:
    """When the slot a start at ``now`` (database clock) belongs to ends."""
    first = next_boundary(expression, now)
    second = next_boundary(expression, first)
    tolerance = min(EARLY_FIRE_TOLERANCE, (second - first).total_seconds() / 4)
    return second if (first - now).total_seconds() < tolerance else first
