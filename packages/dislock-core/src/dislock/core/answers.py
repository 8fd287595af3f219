"""What the lock statements answer, typed, and how each answer is read from its row.

The acquiring statements always answer exactly one row (``dislock.core.lock_statements``
says which statement answers what); a reader here turns it into an ``Acquired`` or
a ``SlotAnswer``, and a TTL over the table's maximum into the error it means.  An
acquisition whose answer was lost and was found afterwards by reading its row
(``dislock.core.unknown_outcome``) becomes the same answer, through ``from_mine``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from dislock.core.errors import ConfigurationError
from dislock.core.exchange import Rows
from dislock.core.failover import TIMELINE_KEY
from dislock.core.limits import DEFAULT_MAX_TTL, MAX_TTL_KEY, too_long
from dislock.core.unknown_outcome import Mine


class Acquired(NamedTuple):
    """The answer of an acquiring statement."""

    acquired: bool
    token: int | None
    """The fencing token (None without fencing)."""
    paused_for: str | None
    """The reason of a live pause of the lock key; set only when one refused the start."""
    paused_until: datetime | None
    slot_end: datetime | None = None
    """The slot end ``acquire_by_clock`` picked by the database clock (None there when
    the clock was outside its candidates; always None for the other statements)."""
    delayed_until: datetime | None = None
    """The end of the lock delay after a failover that kept the statement from taking
    anything (``dislock.core.failover``); None when no delay runs."""
    timeline: int | None = None
    """The server's timeline the statement ran on (None when it is not known)."""
    attempt: int | None = None
    """With retries (``acquire_retrying``): the attempt of the slot it took, or would
    have taken, or leaves to another machine (with ``retry_at``, the end of its grace);
    None when none may start now (or without retries)."""
    retry_at: datetime | None = None
    """With retries: when a failed attempt reopened the slot for a later one, the
    moment that one may start (the row is not taken before)."""
    began_at: datetime | None = None
    """Set when the slot's start deadline had passed: when the slot began.  The claim
    was then the slot's late mark (taken: this acquisition marked it late)."""

    @classmethod
    def nothing(cls) -> Acquired:
        """Not acquired, for no reason the database gave."""
        return cls(False, None, None, None)

    @classmethod
    def from_mine(cls, mine: Mine) -> Acquired:
        """The row a lost acquisition was found to have taken."""
        return cls(True, mine.token, None, None, slot_end=mine.expire_at, timeline=mine.timeline)


class SlotAnswer(NamedTuple):
    """The answer of ``acquire_slot``."""

    key: str | None
    """The slot row taken; None if none was."""
    token: int | None
    free: int
    """How many slots looked free (to tell a full lease from a lost race)."""
    paused_for: str | None
    paused_until: datetime | None
    delayed_until: datetime | None

    @classmethod
    def nothing(cls) -> SlotAnswer:
        return cls(None, None, 0, None, None, None)

    @classmethod
    def from_mine(cls, mine: Mine) -> SlotAnswer:
        return cls(mine.key, mine.token, 1, None, None, None)


class ClaimRow(NamedTuple):
    """The row ``acquire_until``, ``acquire_for`` and ``take_over`` answer (the names of
    its columns, ``dislock.core.exchange.select_list``)."""

    acquired: bool
    token: int | None
    paused_for: str | None
    paused_until: datetime | None
    timeline: int | None
    delayed_until: datetime | None
    ttl_cap: float | None
    """The table's maximum TTL when the lease asked for more (it took nothing)."""


class ClockClaimRow(NamedTuple):
    """The row ``acquire_by_clock`` answers: ``ClaimRow``'s, the slot end it picked last."""

    acquired: bool
    token: int | None
    paused_for: str | None
    paused_until: datetime | None
    timeline: int | None
    delayed_until: datetime | None
    slot_end: datetime | None


class RetryingClaimRow(NamedTuple):
    """The row ``acquire_retrying`` answers: the attempt and when a reopened slot's next
    attempt may start, after ``ClaimRow``'s first six."""

    acquired: bool
    token: int | None
    paused_for: str | None
    paused_until: datetime | None
    timeline: int | None
    delayed_until: datetime | None
    attempt: int | None
    retry_at: datetime | None


class SlotClaimRow(NamedTuple):
    """The row ``acquire_slot`` answers."""

    key: str | None
    token: int | None
    free: int
    paused_for: str | None
    paused_until: datetime | None
    delayed_until: datetime | None
    ttl_cap: float | None


def _one(rows: Rows) -> Sequence[Any]:
    if len(rows) != 1:
        raise ValueError(f"an acquiring statement answers one row, not {len(rows)}")
    return rows[0]


def _within(ttl: float, ttl_cap: float | None) -> None:
    """A lease longer than the table allows took nothing, and says so."""
    if ttl_cap is not None:
        raise ConfigurationError(too_long(ttl, ttl_cap))


def _claimed(row: ClaimRow | ClockClaimRow | RetryingClaimRow, **more: Any) -> Acquired:
    return Acquired(
        bool(row.acquired),
        row.token,
        row.paused_for,
        row.paused_until,
        delayed_until=row.delayed_until,
        timeline=row.timeline,
        **more,
    )


def read_slot_claim(rows: Rows) -> Acquired:
    """The answer of ``acquire_until``."""
    return _claimed(ClaimRow(*_one(rows)))


def read_retrying_claim(rows: Rows) -> Acquired:
    """The answer of ``acquire_retrying``: ``acquire_until``'s, then the attempt and
    the moment a reopened slot's next attempt may start."""
    row = RetryingClaimRow(*_one(rows))
    return _claimed(row, attempt=row.attempt, retry_at=row.retry_at)


def lease_reader(ttl: float) -> Callable[[Rows], Acquired]:
    """The reader of ``acquire_for``'s answer for a lease of ``ttl`` seconds."""

    def read(rows: Rows) -> Acquired:
        row = ClaimRow(*_one(rows))
        _within(ttl, row.ttl_cap)
        return _claimed(row)

    return read


def read_by_clock(rows: Rows) -> Acquired:
    """The answer of ``acquire_by_clock``: ``acquire_until``'s, the slot's end last."""
    row = ClockClaimRow(*_one(rows))
    return _claimed(row, slot_end=row.slot_end)


class LookRow(NamedTuple):
    """A row ``look`` answers: the clocks and the timeline, then one metadata or lock
    row of those it reads."""

    now: datetime
    clock: datetime
    timeline: int
    key: str
    value: str
    expire_at: datetime


def look_reader(
    key: str,
    pause: str,
    *,
    ttl: float | None = None,
    pick: Callable[[datetime], datetime | None] | None = None,
) -> Callable[[Rows], Acquired | None]:
    """The reader of ``look`` at the row ``key`` (paused by the row ``pause``): the
    refusal the acquiring statement would answer, or None when only that statement
    can tell: the row is free, the key paused, a lock delay runs or would start
    (``dislock.core.failover``), ``ttl`` is over the table's maximum, ``pick`` finds no
    slot for the database clock, or a metadata row cannot be read."""

    def read(rows: Rows) -> Acquired | None:
        if not rows:
            return None
        looked = list(map(LookRow._make, rows))
        now, clock, timeline = looked[0].now, looked[0].clock, looked[0].timeline
        found = {row.key: (row.value, row.expire_at) for row in looked}
        held, paused = found.get(key), found.get(pause)
        if held is None or held[1] <= now or (paused is not None and paused[1] > now):
            return None
        try:
            cap = found.get(MAX_TTL_KEY)
            max_ttl = DEFAULT_MAX_TTL if cap is None else float(cap[0])
            seen = found.get(TIMELINE_KEY)
            # A key's delay ends within the maximum TTL of the failover's notice.
            if seen is not None and (
                int(seen[0]) != timeline or clock < seen[1] + timedelta(seconds=max_ttl)
            ):
                return None
            if ttl is not None and ttl > max_ttl:
                return None
        except (TypeError, ValueError, OverflowError):
            return None
        slot_end = None
        if pick is not None:
            slot_end = pick(now)
            if slot_end is None:
                return None
        return Acquired(False, None, None, None, slot_end)

    return read


def slot_reader(ttl: float) -> Callable[[Rows], SlotAnswer]:
    """The reader of ``acquire_slot``'s answer for slots of ``ttl`` seconds."""

    def read(rows: Rows) -> SlotAnswer:
        row = SlotClaimRow(*_one(rows))
        _within(ttl, row.ttl_cap)
        return SlotAnswer(
            None if row.key is None else str(row.key),
            row.token,
            int(row.free),
            row.paused_for,
            row.paused_until,
            row.delayed_until,
        )

    return read


def read_released(rows: Rows) -> bool:
    """The answer of ``release`` and ``hand_back``: whether a row of ours was ended."""
    return len(rows) > 0


class Renewed(NamedTuple):
    """A lease ``renew_batch`` renewed: the row it answers for it."""

    key: str
    owner: str


def read_renewed(rows: Rows) -> list[Renewed]:
    """The answer of ``renew_batch``: each lease renewed."""
    return [Renewed(str(row.key), str(row.owner)) for row in map(Renewed._make, rows)]


def read_clock(rows: Rows) -> datetime:
    """The answer of ``now``."""
    (now,) = _one(rows)
    assert isinstance(now, datetime)
    return now


def read_mine(rows: Rows) -> list[Mine]:
    """The answer of ``mine``: the owner's live rows among the keys."""
    return [mine._replace(key=str(mine.key)) for mine in map(Mine._make, rows)]
