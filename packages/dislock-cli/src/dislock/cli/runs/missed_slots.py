"""The slots of a schedule, the slot each run began in (``slot_indexes``), and the
slots a run still going covered (``split_covered``: a lease job that outlasts its
interval)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone, tzinfo
from typing import NamedTuple

from psycopg import sql

from dislock.cli.runs.run_history import still_held
from dislock.cli.shown import read, rows_of
from dislock.core.after import HELD_BACK
from dislock.core.errors import ConfigurationError
from dislock.core.exchange import Exchange, Rows, select_list

MAX_SLOTS = 100_000
"""Slots ``missed`` examines at most (a per-second schedule over a day is 86,400)."""


DEFAULT_GRACE = timedelta(minutes=1)
"""A slot that began less than this long ago is not judged yet (startup jitter, a
slow cron daemon): ``missed --grace``."""


class StartRow(NamedTuple):
    """A row ``starts`` answers: a history row of the key in the window, or, when there is
    none, one of NULLs but ``ran_before``."""

    started_at: datetime | None
    slot_end: datetime | None
    outcome: str | None
    ran_before: bool
    """Whether the key ran before the window (the same on every row)."""
    running: bool | None
    """Without an end: whether it still holds its lock (running, else abandoned)."""
    waiting_for: str | None = None
    """A ``held_back`` event's key waited for (``dislock.core.after``)."""


def starts(
    history: tuple[str, ...], locks: tuple[str, ...], key: str, since: datetime
) -> Exchange[list[StartRow]]:
    """``key``'s history rows since ``since`` (``StartRow``): at least one row."""
    columns = select_list(
        StartRow._fields,
        started_at=sql.SQL("h.started_at"),
        slot_end=sql.SQL("h.slot_end"),
        outcome=sql.SQL("h.outcome"),
        ran_before=sql.SQL(
            "EXISTS (SELECT FROM {history} AS b WHERE b.lock_key = %(key)s"
            " AND b.started_at < %(since)s)"
        ).format(history=sql.Identifier(*history)),
        running=sql.SQL("h.ended_at IS NULL AND {held}").format(held=still_held("h", locks)),
        waiting_for=sql.SQL("CASE WHEN h.outcome = {held_back} THEN {owner} END").format(
            held_back=sql.Literal(HELD_BACK), owner=read(sql.Identifier("h", "owner"))
        ),
    )
    query = sql.SQL(
        "SELECT {columns}"
        " FROM (VALUES (1)) AS one"
        " LEFT JOIN {history} AS h ON h.lock_key = %(key)s AND h.started_at >= %(since)s"
    ).format(columns=columns, history=sql.Identifier(*history))
    return Exchange(query, {"key": key, "since": since}, rows_of(StartRow))


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
    """The slots of ``expression`` (on the wall clock of ``tz``) that began at or after
    ``since`` and at least ``grace`` before ``now``."""
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


def slot_indexes(
    slots: Sequence[Slot], starts: Sequence[tuple[datetime, datetime | None]]
) -> list[int]:
    """The index among ``slots`` (in order, back to back) of the slot each of
    ``starts`` (started_at, slot_end claimed) belongs to, -1 for none: the slot whose
    end it claimed, or else the one it started in, a start up to
    ``EARLY_FIRE_TOLERANCE`` early counting for the next slot (a host clock a little
    ahead of the database's), as the schedule lock counts it."""
    from bisect import bisect_right

    from dislock.core.cron import EARLY_FIRE_TOLERANCE

    early = timedelta(seconds=EARLY_FIRE_TOLERANCE)
    by_end = {slot.end: index for index, slot in enumerate(slots)}
    beginnings = [slot.start for slot in slots]
    found = []
    for started, slot_end in starts:
        index = bisect_right(beginnings, started + early) - 1
        if slot_end is not None:
            found.append(by_end.get(slot_end, -1))
        else:
            found.append(index if index >= 0 and started < slots[index].end else -1)
    return found


class Span(NamedTuple):
    """A lease run's span, from its start to its end (None: it holds the lease still).  An
    abandoned run has none: when its lease ran out is not known."""

    start: datetime
    end: datetime | None


SPANS_BEFORE = 16
"""Of the runs that started before a window, the newest this many are asked
whether they were still going when it began (an N-holder lease has a few at once)."""


class SpanRow(NamedTuple):
    """A lease run's row, as ``span_of`` reads it (the row ``spans`` answers)."""

    started_at: datetime
    ended_at: datetime | None
    running: bool
    """Without an end: whether it still holds its lease (otherwise it is abandoned)."""


def span_columns(run: str, locks: tuple[str, ...]) -> dict[str, sql.Composable]:
    """The end of the history row ``run`` (an alias) and whether it still holds its lock:
    a ``SpanRow``'s columns but its start."""
    ran = sql.Identifier(run)
    return {
        "ended_at": sql.SQL("{}.ended_at").format(ran),
        "running": sql.SQL("{}.ended_at IS NULL AND {}").format(ran, still_held(run, locks)),
    }


def spans(
    history: tuple[str, ...], locks: tuple[str, ...], key: str, since: datetime
) -> Exchange[list[Span]]:
    """The spans of ``key``'s lease runs that may cover a slot since ``since``: those that
    started since, and those of the newest ``SPANS_BEFORE`` before it that ended after
    it or have no end."""
    table = sql.Identifier(*history)
    query = sql.SQL(
        "SELECT {h} FROM {table} AS h"
        " WHERE h.lock_key = %(key)s AND h.started_at >= %(since)s"
        " AND position('lease' IN h.modes) > 0"
        " UNION ALL SELECT {b}"
        " FROM (SELECT * FROM {table} AS p WHERE p.lock_key = %(key)s"
        " AND p.started_at < %(since)s ORDER BY p.started_at DESC LIMIT {limit}) AS b"
        " WHERE position('lease' IN b.modes) > 0"
        " AND (b.ended_at IS NULL OR b.ended_at > %(since)s)"
    ).format(
        table=table,
        h=select_list(
            SpanRow._fields, started_at=sql.SQL("h.started_at"), **span_columns("h", locks)
        ),
        b=select_list(
            SpanRow._fields, started_at=sql.SQL("b.started_at"), **span_columns("b", locks)
        ),
        limit=sql.Literal(SPANS_BEFORE),
    )
    return Exchange(query, {"key": key, "since": since}, _read_spans)


def _read_spans(rows: Rows) -> list[Span]:
    found = (span_of(row) for row in map(SpanRow._make, rows))
    return [span for span in found if span is not None]


def span_of(row: SpanRow) -> Span | None:
    """The span of a lease run from its history row (None: abandoned, no span)."""
    if row.ended_at is not None:
        return Span(row.started_at, row.ended_at)
    return Span(row.started_at, None) if row.running else None


def split_covered(slots: Sequence[Slot], spans: Sequence[Span]) -> tuple[list[Slot], list[Slot]]:
    """``slots`` in which no run started, split into those missed and those *covered*: a
    run begun before the slot still held its lease when it began.  The spans are merged
    first, so that each slot is one bisection."""
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
    """``slots`` from the one the first of ``starts`` belongs to on (all of them without
    starts): a job new within a window has not missed the slots before it existed.  A
    run's slot is read as ``slot_indexes`` reads it."""
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
