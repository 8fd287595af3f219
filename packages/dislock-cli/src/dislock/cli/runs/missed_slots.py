"""What became of each slot of a key's schedule, from its recorded runs and events: the
slots of a schedule, the slot each run began in (``slot_indexes``), the slots a run still
going covered (``split_covered``: a lease job that outlasts its interval), and each slot's
state (``slot_states``).

``dislockctl missed`` lists the states and ``serve`` counts them; docs/operator.md
("missed") says what each state means.  ``TO_LOOK_AT`` are the ones someone should
look at; the others are the lock working, an operator's choice, or not known yet.  A
slot a ``dislockctl rerun`` reopened is judged by the attempts after the rerun only.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone, tzinfo
from operator import attrgetter
from typing import NamedTuple

from psycopg import sql

from dislock.cli.far_times import iso
from dislock.cli.runs.run_history import still_held
from dislock.cli.shown import read, rows_of
from dislock.core.after import HELD_BACK
from dislock.core.cron import EARLY_FIRE_TOLERANCE, next_boundary
from dislock.core.errors import ConfigurationError
from dislock.core.exchange import Exchange, Rows, select_list
from dislock.core.operator_commands import Pause

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
        return {"slot_start": iso(self.start), "slot_end": iso(self.end)}


def schedule_slots(
    expression: str,
    since: datetime,
    now: datetime,
    grace: timedelta = DEFAULT_GRACE,
    tz: tzinfo = timezone.utc,
) -> Iterator[Slot]:
    """The slots of ``expression`` (on the wall clock of ``tz``) that began at or after
    ``since`` and at least ``grace`` before ``now``."""
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


start_of = attrgetter("start")
end_of = attrgetter("end")
"""Keys to bisect slots (in order, back to back) and merged spans by."""


def slot_indexes(
    slots: Sequence[Slot], starts: Sequence[tuple[datetime, datetime | None]]
) -> list[int]:
    """The index among ``slots`` (in order, back to back) of the slot each of
    ``starts`` (started_at, slot_end claimed) belongs to, -1 for none: the slot whose
    end it claimed, or else the one it started in, a start up to
    ``EARLY_FIRE_TOLERANCE`` early counting for the next slot (a host clock a little
    ahead of the database's), as the schedule lock counts it."""
    early = timedelta(seconds=EARLY_FIRE_TOLERANCE)
    found = []
    for started, slot_end in starts:
        if slot_end is not None:
            index = bisect_left(slots, slot_end, key=end_of)
            found.append(index if index < len(slots) and slots[index].end == slot_end else -1)
        else:
            index = bisect_right(slots, started + early, key=start_of) - 1
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


def merged_spans(spans: Sequence[Span]) -> list[Span]:
    """``spans`` in order of their starts, those that overlap merged: each begins at or
    after the end of the one before."""
    merged: list[Span] = []
    for span in sorted(spans, key=lambda span: span.start):
        last = merged[-1] if merged else None
        if last is not None and (last.end is None or span.start < last.end):
            end = None if last.end is None or span.end is None else max(last.end, span.end)
            merged[-1] = Span(last.start, end)
        else:
            merged.append(span)
    return merged


def split_covered(slots: Sequence[Slot], spans: Sequence[Span]) -> tuple[list[Slot], list[Slot]]:
    """``slots`` in which no run started, split into those missed and those *covered*: a
    run begun before the slot still held its lease when it began.  The spans are merged
    first, so that each slot is one bisection."""
    merged = merged_spans(spans)
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
    if not starts:
        return list(slots)
    tick = timedelta(microseconds=1)
    early = timedelta(seconds=EARLY_FIRE_TOLERANCE)
    # The first slot ending after this instant is the run's own.
    belongs_before = min(
        slot_end - tick if slot_end is not None else started + early for started, slot_end in starts
    )
    return list(slots[bisect_right(slots, belongs_before, key=end_of) :])


DONE = "done"
RUNNING = "running"
RETRYING = "retrying"
FAILED = "failed"
ABANDONED = "abandoned"
LATE = "late"
PAUSED = "paused"
COVERED = "covered"
MISSED = "missed"
STATES = (DONE, RUNNING, RETRYING, FAILED, ABANDONED, HELD_BACK, LATE, PAUSED, COVERED, MISSED)
TO_LOOK_AT = (MISSED, HELD_BACK, LATE, FAILED)
"""The states ``dislockctl missed`` lists by default and exits 1 for (a slot held back is
in the state its outcome names, ``dislock.core.after.HELD_BACK``)."""


class Attempt(NamedTuple):
    """A run of the job as the history recorded it."""

    started_at: datetime
    slot_end: datetime | None
    """The end of the slot it claimed (a schedule lock); None for a lease alone."""
    outcome: str | None
    running: bool = False
    """No end recorded and it still holds its lock (otherwise it was abandoned)."""
    ended_at: datetime | None = None
    """When it ended, where the reader knows (``serve``'s slot strip shows durations)."""


class SlotState(NamedTuple):
    slot: Slot
    state: str
    attempts: int
    waiting_for: str | None = None
    """``held_back``: the key the slot waited for."""

    def as_json(self) -> dict[str, object]:
        waiting = {} if self.waiting_for is None else {"waiting_for": self.waiting_for}
        return {**self.slot.as_json(), "state": self.state, "attempts": self.attempts, **waiting}

    def described(self) -> str:
        """The state as ``missed`` prints it: a held-back slot names its key."""
        if self.state == HELD_BACK and self.waiting_for is not None:
            return f"held back (waiting for {self.waiting_for!r})"
        return self.state.replace("_", " ")


def slot_states(
    slots: Sequence[Slot],
    attempts: Sequence[Attempt],
    *,
    now: datetime,
    late: Collection[datetime] = (),
    pauses: Sequence[Pause] = (),
    spans: Sequence[Span] = (),
    retrying: datetime | None = None,
    reruns: Mapping[datetime, datetime] | None = None,
    held_back: Mapping[datetime, str | None] | None = None,
) -> list[SlotState]:
    """The state of each of ``slots`` (in order).  ``late`` and ``held_back`` (with the
    key waited for): the ends of slots so marked; ``spans``: the lease runs'
    (``split_covered``); ``retrying``: the end of the slot whose row waits for another
    attempt; ``reruns``: when each slot (by its end) was last reopened."""
    by_slot: list[list[Attempt]] = [[] for _ in slots]
    starts = [(attempt.started_at, attempt.slot_end) for attempt in attempts]
    for attempt, index in zip(attempts, slot_indexes(slots, starts), strict=True):
        if index >= 0:
            by_slot[index].append(attempt)
    marks = SlotMarks(late, pauses, retrying, reruns or {}, held_back or {})
    states: dict[int, SlotState] = {}
    unstarted: list[Slot] = []
    for index, (slot, tried) in enumerate(zip(slots, by_slot, strict=True)):
        found = judged(slot, tried, now, marks)
        if found is None:
            unstarted.append(slot)
        else:
            states[index] = found
    _, covered = split_covered(unstarted, spans)
    covered_ends = {slot.end for slot in covered}
    return [
        states.get(index) or SlotState(slot, COVERED if slot.end in covered_ends else MISSED, 0)
        for index, slot in enumerate(slots)
    ]


class SlotMarks(NamedTuple):
    """What marks slots besides the runs begun in them (``slot_states``' arguments)."""

    late: Collection[datetime]
    pauses: Sequence[Pause]
    retrying: datetime | None
    reruns: Mapping[datetime, datetime]
    held_back: Mapping[datetime, str | None]


def judged(
    slot: Slot, tried: Sequence[Attempt], now: datetime, marks: SlotMarks
) -> SlotState | None:
    """The state of ``slot``, given the attempts begun in it; None for a slot nothing
    marks, missed unless a run still going covers it (``split_covered``)."""
    rerun = marks.reruns.get(slot.end)
    if rerun is not None:
        # What the operator asked for is the run after the rerun.
        tried = [attempt for attempt in tried if attempt.started_at > rerun]
    if tried:
        return SlotState(slot, _tried(slot, tried, now, marks.retrying), len(tried))
    if (rerun is not None or marks.retrying == slot.end) and slot.end > now:
        # A rerun not taken yet, told by its event as by the row it reopened: serve,
        # which reads no row, judges it as missed does.
        return SlotState(slot, RETRYING, 0)
    if any(pause.covers(slot.start) for pause in marks.pauses):
        # Paused wins over a late mark: the first wrapper after a resume marks a
        # slot paused past its deadline late, which was the pause's doing.
        return SlotState(slot, PAUSED, 0)
    if slot.end in marks.held_back:
        # Before a late mark: waiting for the key is why it was not started in time.
        return SlotState(slot, HELD_BACK, 0, marks.held_back[slot.end])
    if slot.end in marks.late:
        return SlotState(slot, LATE, 0)
    return None


def _tried(slot: Slot, tried: Sequence[Attempt], now: datetime, retrying: datetime | None) -> str:
    if any(attempt.outcome == "ok" for attempt in tried):
        return DONE
    if any(attempt.outcome is None and attempt.running for attempt in tried):
        return RUNNING
    if retrying == slot.end and slot.end > now:
        return RETRYING
    last = max(tried, key=lambda attempt: attempt.started_at)
    return ABANDONED if last.outcome is None else FAILED


def count(states: Sequence[SlotState]) -> dict[str, int]:
    """How many slots are in each state (every state, zeros included)."""
    return dict.fromkeys(STATES, 0) | Counter(found.state for found in states)
