"""Cron expressions and schedule slots.

A schedule lock's row expires at the next cron boundary, computed from the
database's clock rather than the local one, so machines with skewed clocks agree
on which slot they are in.  Boundaries are computed in UTC so that sessions with
different ``TimeZone`` settings compute the same slot.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

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


class SlotCandidates:
    """The slot ends a start could belong to, for a database clock near the local one.

    A schedule lock would otherwise read the database clock first and compute its
    slot from that: a round trip more on every cron run.  Instead the next few
    slot ends after ``covered_from`` (a little before the local clock) travel with
    the acquiring statement, each with the latest start that still belongs to it
    (``slot_end``'s early-fire tolerance before it), and the statement picks the
    first end whose latest start its ``NOW()`` has not passed.  That is
    ``slot_end(NOW())`` whenever ``NOW()`` falls between ``covered_from`` and the
    last latest start; outside, nothing is picked and the caller reads the clock.
    """

    __slots__ = ("covered_from", "ends", "latest_starts")

    COUNT = 4
    """Ends sent along: a fixed number, so that the statement's text is fixed."""
    BEHIND = 2.0
    """Seconds the database clock may lag the local one and still be covered (it is
    read later than ours, by the statement, so it lags only by clock skew)."""

    def __init__(
        self, covered_from: datetime, ends: list[datetime], latest_starts: list[datetime]
    ) -> None:
        self.covered_from = covered_from
        self.ends = ends
        self.latest_starts = latest_starts

    @classmethod
    def around(cls, expression: str, local_now: datetime) -> SlotCandidates:
        from croniter import croniter

        start = local_now.astimezone(timezone.utc) - timedelta(seconds=cls.BEHIND)
        # One iterator rather than next_boundary per end: the same boundaries
        # (in UTC), a fraction of the cost.
        boundaries = croniter(check_cron(expression), start)
        found: list[datetime] = []
        while len(found) <= cls.COUNT:  # one more: the last end's tolerance needs it
            boundary = boundaries.get_next(datetime)
            if not isinstance(boundary, datetime):  # croniter's return type is loose
                raise TypeError(f"croniter returned {boundary!r}")
            found.append(boundary.astimezone(timezone.utc))
        ends = found[:-1]
        latest = [
            end - timedelta(seconds=min(EARLY_FIRE_TOLERANCE, (after - end).total_seconds() / 4))
            for end, after in zip(ends, found[1:], strict=True)
        ]
        return cls(start, ends, latest)

    def pick(self, now: datetime) -> datetime | None:
        """What the statement picks for a database clock at ``now`` (None: not covered)."""
        if now < self.covered_from:
            return None
        chances = zip(self.ends, self.latest_starts, strict=True)
        return next((end for end, latest in chances if now <= latest), None)
