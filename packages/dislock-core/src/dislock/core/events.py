"""An operator's commands as rows of the run history: ``rerun``, ``pause`` and ``resume``.

They are no runs of the job, but they explain the slots around them: a slot that
began while its key was paused was skipped on purpose, not missed, and a slot run
twice was rerun by someone.  Each event is one history row with the operator's
role (``current_user``) and reason as its owner, ended as soon as it is written: a
granted role may insert a row's start columns and then write the end columns of
a row it inserted, not insert both at once (``dislock.core.grants``).

A pause's row holds the end the operator asked for in ``slot_end``
(``dislock.core.pause.UNTIL_RESUMED`` when none); a ``resume`` of the key, or a
later ``pause`` that replaced it, ends it sooner (``pause_spans``).  A rerun's row
holds the end of the slot it reopened, so that the slot is judged by the attempts
after it (``reruns``).  No new column: a key's pauses are found through a partial
index on ``modes = 'pause'``, its reruns through ``(lock_key, started_at)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import NamedTuple

from psycopg import sql

from dislock.core.exchange import Exchange, Rows

RERUN = "rerun"
PAUSED = "paused"
RESUMED = "resumed"
OUTCOMES = (RERUN, PAUSED, RESUMED)
"""The outcomes of event rows (``dislock.core.history.OUTCOMES`` has them too)."""

PAUSE_MODES = "pause"
"""The ``modes`` of a pause's and a resume's rows, set as they are inserted and never
changed: a partial index on it (``dislock.core.history.create_history``) finds a
key's pauses among all its runs, and leaves the end statement's updates HOT."""

_MODES = {RERUN: "schedule", PAUSED: PAUSE_MODES, RESUMED: PAUSE_MODES}
OUTCOME_VERBS = {RERUN: "rerun", PAUSED: "pause", RESUMED: "resume"}


def _read_id(rows: Rows) -> int:
    ((run_id,),) = rows
    return int(run_id)


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
    """The start of the row of event ``outcome`` (one of ``OUTCOMES``), owned by
    ``<verb> by <role>[: reason]``; ``until``: a pause's planned end, or the end of
    the slot a rerun reopened.  Its id."""
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
    return Exchange(query, params, _read_id)


def record_end(history: tuple[str, ...], run_id: int, outcome: str) -> Exchange[None]:
    """The event's row ended as it started, with its outcome."""
    query = sql.SQL(
        "UPDATE {} SET ended_at = started_at, outcome = %(outcome)s WHERE id = %(id)s"
    ).format(sql.Identifier(*history))
    return Exchange(query, {"id": run_id, "outcome": outcome}, lambda rows: None)


def pauses_query(history: tuple[str, ...]) -> sql.Composed:
    """The events of %(key)s that tell what became of its slots since %(since)s: its
    reruns since then, every pause whose planned end is later, and every pause and
    resume from the oldest of those on (one of them may have ended it sooner).
    started_at, slot_end, outcome; for ``pause_spans`` and ``reruns``.  Pause rows
    are found through the partial index on ``modes = 'pause'`` (``PAUSE_INDEX``)."""
    table = sql.Identifier(*history)
    return sql.SQL(
        "SELECT e.started_at, e.slot_end, e.outcome FROM {table} AS e"
        " WHERE e.lock_key = %(key)s AND e.modes = {pause}"
        " AND e.started_at >= LEAST(%(since)s, (SELECT min(p.started_at) FROM {table} AS p"
        " WHERE p.lock_key = %(key)s AND p.modes = {pause} AND p.outcome = {paused}"
        " AND p.slot_end > %(since)s))"
        " UNION ALL SELECT r.started_at, r.slot_end, r.outcome FROM {table} AS r"
        " WHERE r.lock_key = %(key)s AND r.started_at >= %(since)s AND r.outcome = {rerun}"
    ).format(
        table=table,
        pause=sql.Literal(PAUSE_MODES),
        paused=sql.Literal(PAUSED),
        rerun=sql.Literal(RERUN),
    )


def reruns(events: Iterable[tuple[datetime, datetime | None, str]]) -> dict[datetime, datetime]:
    """For each slot (by its end) a rerun reopened, when the latest rerun of it was."""
    found: dict[datetime, datetime] = {}
    for started, slot_end, outcome in events:
        if outcome == RERUN and slot_end is not None:
            found[slot_end] = max(started, found.get(slot_end, started))
    return found


class Pause(NamedTuple):
    """A key's pause, from when ``dislockctl pause`` wrote it until it ended."""

    start: datetime
    end: datetime

    def covers(self, instant: datetime) -> bool:
        return self.start <= instant < self.end


def pause_spans(events: Iterable[tuple[datetime, datetime | None, str]]) -> list[Pause]:
    """One key's pauses, in order, from its events (started_at, slot_end, outcome):
    each pause lasts until its planned end, or until the key's next pause or resume
    event, whichever comes first (a new pause replaces the row of the old one)."""
    from dislock.core.pause import UNTIL_RESUMED

    # A rerun is an event of the key too, but no end of a pause.
    ordered = sorted(
        (event for event in events if event[2] in (PAUSED, RESUMED)), key=lambda event: event[0]
    )
    spans = []
    for index, (started, planned, outcome) in enumerate(ordered):
        if outcome != PAUSED:
            continue
        end = planned or UNTIL_RESUMED
        if index + 1 < len(ordered):
            end = min(end, ordered[index + 1][0])
        if end > started:
            spans.append(Pause(started, end))
    return spans
