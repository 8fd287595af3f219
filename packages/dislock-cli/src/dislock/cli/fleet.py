"""Reading the run history for operators: runs, missed slots, durations, rendering.

``dislockctl history`` and ``missed`` use these, and so can anything else that
reports on the fleet (an exporter, a status page): ``runs_query`` gives runs with
their derived state (``running``, ``abandoned``), ``missed_slots`` the slots of a
schedule in which no run started, and ``split_covered`` tells those apart from
the slots a run still going covered (a lease job that outlasts its interval: the
next slot's starts skip because the lease is held, which is the lock working).
The statements a run writes are in ``dislock.core.history``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any, NamedTuple

from psycopg import sql

from dislock.core.errors import ConfigurationError
from dislock.core.rows import lease_key, schedule_key

MAX_SLOTS = 100_000
"""Slots ``missed`` examines at most (a per-second schedule over a day is 86,400)."""

DEFAULT_GRACE = timedelta(minutes=1)
"""A slot that began less than this long ago is not judged yet (startup jitter, a
slow cron daemon): ``missed --grace``."""

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


def parse_time(text: str, *, name: str) -> datetime:
    """An ISO 8601 time; one without an offset is UTC."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigurationError(
            f"{name} must be an ISO 8601 time like 2026-12-01T06:00 or "
            f"2026-12-01T06:00+01:00, got {text!r}"
        ) from None
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def table_exists_query(table_parts: tuple[str, ...]) -> tuple[str, tuple[str]]:
    """Whether a table exists, from the catalog (no rights on it needed)."""
    return "SELECT to_regclass(%s) IS NOT NULL", (sql.Identifier(*table_parts).as_string(None),)


class Run(NamedTuple):
    """One run from the history, as ``runs_query`` returns it."""

    id: int
    key: str
    modes: str
    slot_end: datetime | None
    owner: str
    host: str
    pid: int
    started_at: datetime
    ended_at: datetime | None
    outcome: str
    """ok | failed | lease_lost | killed, or (no end recorded) running | abandoned."""
    exit_code: int | None
    signal: int | None
    duration_seconds: float | None
    """Ended minus started; for a running run, so far; None when abandoned."""
    cron: str | None
    cron_tz: str | None

    def as_json(self) -> dict[str, Any]:
        data = self._asdict()
        for name in ("slot_end", "started_at", "ended_at"):
            value = data[name]
            data[name] = None if value is None else value.isoformat()
        return data


def still_held(run: str, locks: tuple[str, ...]) -> sql.Composed:
    """Whether the run ``run`` (an alias) still holds a lock of its key: its lease
    (or a slot of an N-holder lease, ``cronjob-lock:lease#<n>:<key>``) when it took
    one, else its schedule slot, with its owner token and not expired.  Evaluated
    only for runs without an end."""
    return sql.SQL(
        "EXISTS (SELECT FROM {locks} AS l WHERE l.value = {run}.owner AND l.expire_at > NOW()"
        " AND starts_with(l.key, CASE WHEN position('lease' IN {run}.modes) > 0"
        " THEN {lease} ELSE {slot} END)"
        " AND right(l.key, length({run}.lock_key) + 1) = ':' || {run}.lock_key)"
    ).format(
        locks=sql.Identifier(*locks),
        run=sql.Identifier(run),
        lease=sql.Literal(lease_key("").rstrip(":")),
        slot=sql.Literal(schedule_key("")),
    )


def runs_query(history: tuple[str, ...], locks: tuple[str, ...], *, by_key: bool) -> sql.Composed:
    """Runs started since %(since)s seconds ago (optionally of %(key)s), newest
    first, at most %(limit)s; a run without an end is ``running`` while the lock
    it took is still held by its owner (the lease when it had one, else the
    schedule slot), ``abandoned`` once that lock expired."""
    held = still_held("h", locks)
    key_filter = sql.SQL(" AND h.lock_key = %(key)s") if by_key else sql.SQL("")
    return sql.SQL(
        "SELECT h.id, h.lock_key, h.modes, h.slot_end, h.owner, h.host, h.pid,"
        " h.started_at, h.ended_at, state.outcome, h.exit_code, h.signal,"
        " CASE WHEN state.outcome = 'abandoned' THEN NULL"
        " ELSE EXTRACT(EPOCH FROM (COALESCE(h.ended_at, NOW()) - h.started_at))::float8 END,"
        " h.cron, h.cron_tz"
        " FROM {history} AS h,"
        " LATERAL (SELECT CASE WHEN h.ended_at IS NOT NULL THEN h.outcome"
        " WHEN {held} THEN 'running' ELSE 'abandoned' END AS outcome) AS state"
        " WHERE h.started_at >= NOW() - make_interval(secs => %(since)s){key_filter}"
        " ORDER BY h.started_at DESC LIMIT %(limit)s"
    ).format(history=sql.Identifier(*history), held=held, key_filter=key_filter)


def latest_query(history: tuple[str, ...], locks: tuple[str, ...]) -> sql.Composed:
    """Per lock key with a schedule or lease row: its newest run (id, started_at,
    ended_at, outcome as ``runs_query`` derives it, duration_seconds, host) and its
    newest successful run's start and end.  Each lookup is an index scan of
    ``(lock_key, started_at DESC)``, so the cost grows with the number of keys,
    not with the history's length (an exporter's scrape, a status page)."""
    lease, slot = lease_key(""), schedule_key("")
    held = still_held("last", locks)
    return sql.SQL(
        "SELECT keys.lock_key, last.id, last.started_at, last.ended_at,"
        " CASE WHEN last.id IS NULL THEN NULL WHEN last.ended_at IS NOT NULL THEN last.outcome"
        " WHEN {held} THEN 'running' ELSE 'abandoned' END,"
        " EXTRACT(EPOCH FROM (last.ended_at - last.started_at))::float8, last.host,"
        " ok.started_at, ok.ended_at"
        " FROM (SELECT DISTINCT substr(key, length(CASE WHEN starts_with(key, {lease})"
        " THEN {lease} ELSE {slot} END) + 1) AS lock_key FROM {locks}"
        " WHERE starts_with(key, {lease}) OR starts_with(key, {slot})) AS keys"
        " LEFT JOIN LATERAL (SELECT * FROM {history} AS h WHERE h.lock_key = keys.lock_key"
        " ORDER BY h.started_at DESC LIMIT 1) AS last ON true"
        " LEFT JOIN LATERAL (SELECT h.started_at, h.ended_at FROM {history} AS h"
        " WHERE h.lock_key = keys.lock_key AND h.outcome = 'ok'"
        " ORDER BY h.started_at DESC LIMIT 1) AS ok ON true"
        " ORDER BY keys.lock_key"
    ).format(
        history=sql.Identifier(*history),
        locks=sql.Identifier(*locks),
        lease=sql.Literal(lease),
        slot=sql.Literal(slot),
        held=held,
    )


class Latest(NamedTuple):
    """A row of ``latest_query``; the run fields are None for a key that never ran."""

    key: str
    run_id: int | None
    started_at: datetime | None
    ended_at: datetime | None
    outcome: str | None
    duration_seconds: float | None
    host: str | None
    last_success_started_at: datetime | None
    last_success_ended_at: datetime | None


def runs_params(key: str | None, since: timedelta, limit: int) -> dict[str, Any]:
    return {"key": key, "since": since.total_seconds(), "limit": limit}


def known_key_query(history: tuple[str, ...], locks: tuple[str, ...]) -> sql.Composed:
    """Whether %(key)s ever ran (history) or has a lock row."""
    return sql.SQL(
        "SELECT EXISTS (SELECT FROM {history} WHERE lock_key = %(key)s)"
        " OR EXISTS (SELECT FROM {locks} WHERE key = ANY(%(rows)s))"
    ).format(history=sql.Identifier(*history), locks=sql.Identifier(*locks))


def known_key_params(key: str) -> dict[str, Any]:
    return {"key": key, "rows": [schedule_key(key), lease_key(key)]}


def schedule_query(history: tuple[str, ...]) -> sql.Composed:
    """The cron expression (and zone) recorded with %(key)s's newest run that had one."""
    return sql.SQL(
        "SELECT cron, cron_tz FROM {} WHERE lock_key = %(key)s AND cron IS NOT NULL"
        " ORDER BY started_at DESC LIMIT 1"
    ).format(sql.Identifier(*history))


def readings_query(history: tuple[str, ...]) -> sql.Composed:
    """How the runs since %(since)s (of %(key)s, or of every key when it is NULL)
    read their schedule: one row per key, cron expression and zone, with the number
    of runs and the hosts that read it so.  A schedule read in different zones by
    different machines puts several real fires into one slot (or none), so a key
    with more than one reading is worth an operator's attention."""
    return sql.SQL(
        "SELECT lock_key, cron, coalesce(cron_tz, 'UTC'), count(*),"
        " string_agg(DISTINCT host, ', ' ORDER BY host)"
        " FROM {} WHERE started_at >= %(since)s AND cron IS NOT NULL"
        " AND (%(key)s::text IS NULL OR lock_key = %(key)s::text)"
        " GROUP BY 1, 2, 3 ORDER BY 1, 4 DESC, 2, 3"
    ).format(sql.Identifier(*history))


class Reading(NamedTuple):
    """One way the runs of a key read its schedule (a row of ``readings_query``)."""

    key: str
    cron: str
    cron_tz: str
    runs: int
    hosts: str

    def as_json(self) -> dict[str, Any]:
        return self._asdict()


def disagreements(readings: Sequence[Reading]) -> dict[str, list[Reading]]:
    """The keys whose runs read their schedule in more than one way, with the readings."""
    by_key: dict[str, list[Reading]] = {}
    for reading in readings:
        by_key.setdefault(reading.key, []).append(reading)
    return {key: found for key, found in by_key.items() if len(found) > 1}


def describe_disagreement(key: str, readings: Sequence[Reading]) -> str:
    """One line for an operator: the key, each reading, and what to do."""
    ways = "; ".join(f"{r.cron!r} in {r.cron_tz} by {r.runs} run(s) on {r.hosts}" for r in readings)
    return (
        f"warning: the runs of {key!r} read its schedule differently ({ways}): "
        "set the same CRON_TZ (and CRON_SCHEDULE) on every machine"
    )


def starts_query(history: tuple[str, ...]) -> sql.Composed:
    """When %(key)s's runs since %(since)s started and which slot they claimed, with
    the database clock and whether the key ran before %(since)s (first row; NULLs
    when there are no runs).  The earlier run is one index probe of
    ``(lock_key, started_at DESC)``."""
    return sql.SQL(
        "SELECT NOW(), h.started_at, h.slot_end,"
        " EXISTS (SELECT FROM {history} AS b WHERE b.lock_key = %(key)s"
        " AND b.started_at < %(since)s)"
        " FROM (VALUES (1)) AS one"
        " LEFT JOIN {history} AS h ON h.lock_key = %(key)s AND h.started_at >= %(since)s"
    ).format(history=sql.Identifier(*history))


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


def prune_query(history: tuple[str, ...]) -> sql.Composed:
    """Delete runs started more than %(older)s seconds ago; returns how many."""
    return sql.SQL(
        "WITH gone AS (DELETE FROM {} WHERE started_at < NOW() - make_interval(secs => %(older)s)"
        " RETURNING 1) SELECT count(*) FROM gone"
    ).format(sql.Identifier(*history))


def format_time(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def describe_outcome(run: Run) -> str:
    if run.outcome == "killed" and run.signal is not None:
        import signal

        try:
            name = signal.Signals(run.signal).name
        except ValueError:
            name = f"signal {run.signal}"
        return f"killed ({name})"
    if run.outcome in ("failed", "lease_lost") and run.exit_code is not None:
        return f"{run.outcome.replace('_', ' ')} ({run.exit_code})"
    return run.outcome.replace("_", " ")


def render_runs(runs: Sequence[Run]) -> str:
    from dislock.cli.admin import format_duration
    from dislock.core.bounds import escape

    headers = ("STARTED (UTC)", "LOCK KEY", "HOST", "PID", "DURATION", "OUTCOME")
    lines = [
        (
            format_time(run.started_at),
            # Written by any machine (or by hand): escaped as `ls` escapes, so that
            # a terminal sequence in a host name is shown, never obeyed.
            escape(run.key),
            escape(run.host),
            str(run.pid),
            "-" if run.duration_seconds is None else format_duration(run.duration_seconds),
            escape(describe_outcome(run)),
        )
        for run in runs
    ]
    return _columns(headers, lines)


def describe_missed(
    key: str,
    schedule: str,
    zone: str,
    since: datetime,
    *,
    judged: int,
    missed: int,
    covered: int,
) -> str:
    """The summary line of ``dislockctl missed``."""
    line = (
        f"{missed} of {judged} slot(s) of {schedule!r} ({zone}) since {since:%Y-%m-%d %H:%M:%S}"
        f" UTC had no run of {key!r}"
    )
    if not missed:
        line += ": none missed"
    if covered:
        line += (
            f"; {covered} slot(s) were covered (no start, but a run of it was still going"
            " and held its lease)"
        )
    return line


def render_missed(slots: Sequence[Slot]) -> str:
    headers = ("SLOT START (UTC)", "SLOT END (UTC)")
    return _columns(headers, [(format_time(s.start), format_time(s.end)) for s in slots])


def _columns(headers: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    widths = [max(len(cells[i]) for cells in (headers, *lines)) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        for cells in (headers, *lines)
    )


def dump(data: Any) -> str:
    return json.dumps(data, indent=2)
