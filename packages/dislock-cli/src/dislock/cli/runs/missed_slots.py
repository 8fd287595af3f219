"""The slots of a schedule in which no run started, and those a run still going
covered.

``dislockctl missed`` and the exporter use these: ``missed_slots`` gives the slots
of a schedule in which no run started, and ``split_covered`` tells those apart
from the slots a run still going covered (a lease job that outlasts its interval:
the next slot's starts skip because the lease is held, which is the lock working).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone, tzinfo
from typing import NamedTuple

from psycopg import sql

from dislock.cli.runs.run_history import still_held
from dislock.core.errors import ConfigurationError

MAX_SLOTS = 100_000
"""Slots ``missed`` examines at most (a per-second schedule over a day is 86,400)."""


DEFAULT_GRACE = timedelta(minutes=1)
"""A slot that began less than this long ago is not judged yet (startup jitter, a
slow cron daemon): ``missed --grace``."""


def starts_query(history: tuple[str, ...], locks: tuple[str, ...]) -> sql.Composed:
    """When %(key)s's runs since %(since)s started, which slot they claimed, how
    they ended, whether one without an end still holds its lock (running, else
    abandoned), with the database clock and whether the key ran before %(since)s
    (first row; NULLs when there are no runs).  The earlier run is one index probe
    of ``(lock_key, started_at DESC)``."""
    return sql.SQL(
        "SELECT NOW(), h.started_at, h.slot_end, h.outcome,"
        " EXISTS (SELECT FROM {history} AS b WHERE b.lock_key = %(key)s"
        " AND b.started_at < %(since)s),"
        " h.ended_at IS NULL AND {held}"
        " FROM (VALUES (1)) AS one"
        " LEFT JOIN {history} AS h ON h.lock_key = %(key)s AND h.started_at >= %(since)s"
    ).format(history=sql.Identifier(*history), held=still_held("h", locks))


class Slot(NamedTuple):
    start: datetime
    end: datetime

    def as_json(self) -> dict[str, str]:
        return {"slot_start": self.start.isoformat(), "slot_end": self.end.isoformat()}


def schedule_slots(
    expression: str,
    since: datetime,
    now: datetime,
    grace: timedelta = DEFAULT_GRACE,
    tz: tzinfo = timezone.utc,
) -> Iterator[Slot]:
    """The slots of ``expression`` (read on the wall clock of ``tz``, as the locks
    read it) that began at or after ``since`` and at least ``grace`` before ``now``."""
    from dislock.core.cron import next_boundary

    start = next_boundary(expression, since - timedelta(microseconds=1), tz)
    for _ in range(MAX_SLOTS):
        if start + grace > now:
            return
        end = next_boundary(expression, start, tz)
        yield Slot(start, end)
        start = end
    raise ConfigurationError(
        f"the window holds more than {MAX_SLOTS:,} slots of {expression!r}: use a shorter --since"
    )


def missed_slots(
    slots: Sequence[Slot], starts: Sequence[tuple[datetime, datetime | None]]
) -> list[Slot]:
    """The slots (in order, back to back) in which none of ``starts``
    (started_at, slot_end claimed) began.

    A run belongs to the slot whose end it claimed (a schedule lock), or else to
    the slot it started in, a start up to ``EARLY_FIRE_TOLERANCE`` early counting
    for the next slot (a host clock a little ahead of the database's), as the
    schedule lock itself counts it.
    """
    from bisect import bisect_right

    from dislock.core.cron import EARLY_FIRE_TOLERANCE

    early = timedelta(seconds=EARLY_FIRE_TOLERANCE)
    claimed = {slot_end for _, slot_end in starts if slot_end is not None}
    beginnings = [slot.start for slot in slots]
    covered = set()
    for started, slot_end in starts:
        if slot_end is None:
            index = bisect_right(beginnings, started + early) - 1
            if 0 <= index < len(slots) and started < slots[index].end:
                covered.add(index)
    return [
        slot for index, slot in enumerate(slots) if index not in covered and slot.end not in claimed
    ]


class Span(NamedTuple):
    """A run that held the key's lease: from its start to its end (None: it holds
    it still).  A run that died without an end (abandoned) has no span: when its
    lease ran out is not known, and the slots after it are worth a look."""

    start: datetime
    end: datetime | None


SPANS_BEFORE = 16
"""Of the runs that started before a window, the newest this many are asked
whether they were still going when it began (an N-holder lease has a few at once)."""


def spans_query(history: tuple[str, ...], locks: tuple[str, ...]) -> sql.Composed:
    """The lease runs of %(key)s that may cover a slot since %(since)s: those that
    started since then, and those of the newest ``SPANS_BEFORE`` before it that
    ended after it or have no end: started_at, ended_at, and whether a run without
    an end still holds its lease (``running``; otherwise it is abandoned).  Index
    scans of ``(lock_key, started_at DESC)``."""
    table = sql.Identifier(*history)
    return sql.SQL(
        "SELECT h.started_at, h.ended_at, h.ended_at IS NULL AND {held_h} FROM {table} AS h"
        " WHERE h.lock_key = %(key)s AND h.started_at >= %(since)s"
        " AND position('lease' IN h.modes) > 0"
        " UNION ALL SELECT b.started_at, b.ended_at, b.ended_at IS NULL AND {held_b}"
        " FROM (SELECT * FROM {table} AS p WHERE p.lock_key = %(key)s"
        " AND p.started_at < %(since)s ORDER BY p.started_at DESC LIMIT {limit}) AS b"
        " WHERE position('lease' IN b.modes) > 0"
        " AND (b.ended_at IS NULL OR b.ended_at > %(since)s)"
    ).format(
        table=table,
        held_h=still_held("h", locks),
        held_b=still_held("b", locks),
        limit=sql.Literal(SPANS_BEFORE),
    )


def span_of(started_at: datetime, ended_at: datetime | None, running: bool) -> Span | None:
    """The span of a lease run from its history row (None: abandoned, no span)."""
    if ended_at is not None:
        return Span(started_at, ended_at)
    return Span(started_at, None) if running else None


def split_covered(slots: Sequence[Slot], spans: Sequence[Span]) -> tuple[list[Slot], list[Slot]]:
    """``slots`` in which no run started (``missed_slots``), split into those
    nobody ran in (missed) and those *covered*: a run of the key that began before
    the slot began still held its lease when it began, so the slot's starts skipped.

    The spans are merged first, so that each slot is one bisection however many
    slots a long run covers.
    """
    from bisect import bisect_left

    merged: list[Span] = []
    for span in sorted(spans, key=lambda span: span.start):
        last = merged[-1] if merged else None
        if last is not None and (last.end is None or span.start < last.end):
            end = None if last.end is None or span.end is None else max(last.end, span.end)
            merged[-1] = Span(last.start, end)
        else:
            merged.append(span)
    beginnings = [span.start for span in merged]
    missed: list[Slot] = []
    covered: list[Slot] = []
    for slot in slots:
        index = bisect_left(beginnings, slot.start) - 1  # the last span begun before it
        end = merged[index].end if index >= 0 else slot.start
        going = index >= 0 and (end is None or end > slot.start)
        (covered if going else missed).append(slot)
    return missed, covered


def from_first_run(
    slots: Sequence[Slot], starts: Sequence[tuple[datetime, datetime | None]]
) -> list[Slot]:
    """``slots`` from the one the first of ``starts`` belongs to on (all of them
    when there are no starts): a job new within a window has not missed the slots
    before it existed.

    A run's slot is read as ``missed_slots`` reads it, so a start in a slot's last
    second that claimed the next slot does not leave the slot it started in missed.
    """
    from dislock.core.cron import EARLY_FIRE_TOLERANCE

    if not starts:
        return list(slots)
    tick = timedelta(microseconds=1)
    early = timedelta(seconds=EARLY_FIRE_TOLERANCE)
    # The first slot ending after this instant is the run's own.
    belongs_before = min(
        slot_end - tick if slot_end is not None else started + early for started, slot_end in starts
    )
    return [slot for slot in slots if slot.end > belongs_before]
