"""An operator's commands as rows of the run history: ``rerun``, ``pause`` and ``resume``.

They are no runs of the job, but they explain the slots around them: a slot that
began while its key was paused was skipped on purpose, not missed, and a slot run
twice was rerun by someone.  Each event is one history row owned by the operator's
role and reason, inserted and then ended (a granted role may not insert both at
once).  A pause's ``slot_end`` is the end asked for; a rerun's, the end of the slot
it reopened.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import NamedTuple

from psycopg import sql

from dislock.core.after import HELD_BACK
from dislock.core.exchange import Exchange, select_list

RERUN = "rerun"
PAUSED = "paused"
RESUMED = "resumed"
OUTCOMES = (RERUN, PAUSED, RESUMED, HELD_BACK)
"""The outcomes of event rows (``held_back``'s is the wrapper's, not an operator's)."""

PAUSE_MODES = "pause"
"""The ``modes`` of a pause's and a resume's rows, never changed once inserted: a
partial index on it finds a key's pauses, and leaves the end statement's updates HOT."""

_MODES = {RERUN: "schedule", PAUSED: PAUSE_MODES, RESUMED: PAUSE_MODES}
OUTCOME_VERBS = {RERUN: "rerun", PAUSED: "pause", RESUMED: "resume"}
"""The operator's events (``record_start`` writes these only)."""


def record_start(
    history: tuple[str, ...],
    lock_key: str,
    outcome: str,
    *,
    reason: str,
    host: str,
    pid: int,
    until: datetime | None = None,
) -> Exchange[int]:
    """The start of the row of event ``outcome``, owned by ``<verb> by <role>[: reason]``;
    ``until``: a pause's planned end, or the end of the slot a rerun reopened."""
    from dislock.core.history import read_run_id  # history imports this module

    query = sql.SQL(
        "INSERT INTO {} (lock_key, modes, slot_end, owner, host, pid, started_at)"
        " VALUES (%(key)s, %(modes)s, %(until)s, %(verb)s || ' by ' || current_user || %(why)s,"
        " %(host)s, %(pid)s, NOW()) RETURNING id"
    ).format(sql.Identifier(*history))
    params = {
        "key": lock_key,
        "modes": _MODES[outcome],
        "until": until,
        "verb": OUTCOME_VERBS[outcome],
        "why": f": {reason}" if reason else "",
        "host": host,
        "pid": pid,
    }
    return Exchange(query, params, read_run_id)


def record_end(history: tuple[str, ...], run_id: int, outcome: str) -> Exchange[None]:
    """The event's row ended as it started, with its outcome."""
    query = sql.SQL(
        "UPDATE {} SET ended_at = started_at, outcome = %(outcome)s WHERE id = %(id)s"
    ).format(sql.Identifier(*history))
    return Exchange(query, {"id": run_id, "outcome": outcome}, lambda rows: None)


class Event(NamedTuple):
    """An event of a key: the row ``pauses`` answers."""

    started_at: datetime
    slot_end: datetime | None
    """A pause's planned end, the end of the slot a rerun reopened (a resume has
    none)."""
    outcome: str


def event_columns(row: str) -> sql.Composed:
    """The columns of an ``Event`` from the history row ``row`` (an alias), in order."""
    return select_list(
        Event._fields, **{field: sql.Identifier(row, field) for field in Event._fields}
    )


def pauses(history: tuple[str, ...], key: str, since: datetime) -> Exchange[list[Event]]:
    """The events of ``key`` that tell what became of its slots since ``since``: its
    reruns since then, every pause whose planned end is later, and every pause and
    resume from the oldest of those on (one of them may have ended it sooner)."""
    table = sql.Identifier(*history)
    query = sql.SQL(
        "SELECT {e} FROM {table} AS e"
        " WHERE e.lock_key = %(key)s AND e.modes = {pause}"
        " AND e.started_at >= LEAST(%(since)s, (SELECT min(p.started_at) FROM {table} AS p"
        " WHERE p.lock_key = %(key)s AND p.modes = {pause} AND p.outcome = {paused}"
        " AND p.slot_end > %(since)s))"
        " UNION ALL SELECT {r} FROM {table} AS r"
        " WHERE r.lock_key = %(key)s AND r.started_at >= %(since)s AND r.outcome = {rerun}"
    ).format(
        e=event_columns("e"),
        r=event_columns("r"),
        table=table,
        pause=sql.Literal(PAUSE_MODES),
        paused=sql.Literal(PAUSED),
        rerun=sql.Literal(RERUN),
    )
    return Exchange(query, {"key": key, "since": since}, lambda rows: list(map(Event._make, rows)))


def reruns(events: Iterable[Event]) -> dict[datetime, datetime]:
    """For each slot (by its end) a rerun reopened, when the latest rerun of it was."""
    found: dict[datetime, datetime] = {}
    for event in events:
        if event.outcome == RERUN and event.slot_end is not None:
            started = event.started_at
            found[event.slot_end] = max(started, found.get(event.slot_end, started))
    return found


class Pause(NamedTuple):
    """A key's pause, from when ``dislockctl pause`` wrote it until it ended."""

    start: datetime
    end: datetime

    def covers(self, instant: datetime) -> bool:
        return self.start <= instant < self.end


def pause_spans(events: Iterable[Event]) -> list[Pause]:
    """One key's pauses, in order: each lasts until its planned end, or until the
    key's next pause or resume (a new pause replaces the old one), whichever is first."""
    from dislock.core.pause import UNTIL_RESUMED

    # A rerun is an event of the key too, but no end of a pause.
    ordered = sorted(
        (event for event in events if event.outcome in (PAUSED, RESUMED)),
        key=lambda event: event.started_at,
    )
    spans = []
    for index, event in enumerate(ordered):
        if event.outcome != PAUSED:
            continue
        end = event.slot_end or UNTIL_RESUMED
        if index + 1 < len(ordered):
            end = min(end, ordered[index + 1].started_at)
        if end > event.started_at:
            spans.append(Pause(event.started_at, end))
    return spans
