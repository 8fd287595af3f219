"""An operator's commands as rows of the run history: ``rerun``, ``pause`` and ``resume``.

They are no runs of the job, but they explain the slots around them: a slot that
began while its key was paused was skipped on purpose, not missed, and a slot run
twice was rerun by someone.  Each event is one history row with the operator's
role (``current_user``) and reason as its owner, ended as soon as it is written: a
granted role may insert a row's start columns and then write the end columns of
a row it inserted, not insert both at once (``dislock.core.grants``).

A pause's row holds the end the operator asked for in ``slot_end``
(``dislock.core.pause.UNTIL_RESUMED`` when none); a ``resume`` of the key, or a
later ``pause`` that replaced it, ends it sooner (``pause_spans``).  Reading the
spans back needs no new column and no new index: a key's events are found through
``(lock_key, started_at)`` as its runs are.
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

_MODES = {RERUN: "schedule", PAUSED: "pause", RESUMED: "pause"}
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
    ``<verb> by <role>[: reason]``; ``until``: a pause's planned end.  Its id."""
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
    """The pause and resume events of %(key)s that can tell which of its slots since
    %(since)s were paused: every pause whose planned end is later, and every event
    from the oldest of those on (one of them may have ended it sooner).
    started_at, slot_end, outcome; for ``pause_spans``."""
    table = sql.Identifier(*history)
    return sql.SQL(
        "SELECT e.started_at, e.slot_end, e.outcome FROM {table} AS e"
        " WHERE e.lock_key = %(key)s AND e.outcome IN ({paused}, {resumed})"
        " AND e.started_at >= LEAST(%(since)s, (SELECT min(p.started_at) FROM {table} AS p"
        " WHERE p.lock_key = %(key)s AND p.outcome = {paused} AND p.slot_end > %(since)s))"
    ).format(table=table, paused=sql.Literal(PAUSED), resumed=sql.Literal(RESUMED))


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

    ordered = sorted(events, key=lambda event: event[0])
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
