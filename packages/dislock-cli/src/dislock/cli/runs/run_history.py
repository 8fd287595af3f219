"""The run history as operators read it: runs with their derived state, each key's
newest run, how the runs read their schedule, and pruning, each an exchange
(``dislock.core.exchange``).  The statements a run writes are ``dislock.core.history``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from psycopg import sql

from dislock.cli.far_times import iso
from dislock.cli.shown import READ, read, rows_of, was_cut
from dislock.core import operator_commands
from dislock.core.bounds import SHOWN_CHARS, clip, printable
from dislock.core.exchange import Exchange, Rows, read_flag, read_value, select_list
from dislock.core.history import TAILS
from dislock.core.rows import lease_key, schedule_key
from dislock.core.variables import OUTPUT_TAIL


class Run(NamedTuple):
    """One run from the history, as ``runs`` answers it."""

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
    stdout_tail: str | None = None
    stderr_tail: str | None = None
    """The end of a failed run's output (``LockContext.output_tail_bytes``)."""
    truncated: bool = False
    """A text of the run was cut (``dislock.cli.shown``); its reader tells."""

    def as_json(self) -> dict[str, Any]:
        data = self._asdict()
        for name in ("slot_end", "started_at", "ended_at"):
            value = data[name]
            data[name] = None if value is None else iso(value)
        out, err = data.pop("stdout_tail"), data.pop("stderr_tail")
        data["output"] = None if out is None and err is None else {"stdout": out, "stderr": err}
        return data


def still_held(run: str, locks: tuple[str, ...]) -> sql.Composed:
    """Whether the run ``run`` (an alias, without an end) still holds the lock of its key
    it took (its lease or lease slot, else its schedule slot), with its owner token
    and not expired.  An ``IN`` of a subquery that names no run: PostgreSQL reads the
    live locks once, into a hash, not once a run (20,000 unended runs and as many locks
    had cost a scrape its statement timeout, review #48)."""
    return sql.SQL(
        "({run}.lock_key, {run}.owner, position('lease' IN {run}.modes) > 0) IN ("
        "SELECT regexp_replace(l.key, '^[^:]*:[^:]*:', ''),"
        " split_part(l.value, ' (attempt ', 1), starts_with(l.key, {lease})"
        " FROM {locks} AS l WHERE l.expire_at > NOW()"
        " AND (starts_with(l.key, {lease}) OR starts_with(l.key, {slot})))"
    ).format(
        locks=sql.Identifier(*locks),
        run=sql.Identifier(run),
        lease=sql.Literal(lease_key("").rstrip(":")),
        slot=sql.Literal(schedule_key("")),
    )


_COLUMNS = ("modes", "owner", "host", "cron", "cron_tz")
"""The history's text columns a ``Run`` reads under their own names."""
_TEXTS = ("key", "outcome", *_COLUMNS)
"""The text fields of a ``Run``, each read as ``dislock.cli.shown`` reads texts."""


def runs(
    history: tuple[str, ...], locks: tuple[str, ...], key: str | None, since: timedelta, limit: int
) -> Exchange[list[Run]]:
    """Runs started within ``since`` (of ``key``, or of every key), newest first, at most
    ``limit``; a run without an end is ``running`` while ``still_held``, else
    ``abandoned``."""
    columns = select_list(
        Run._fields,
        id=sql.SQL("h.id"),
        key=read(sql.Identifier("h", "lock_key")),
        slot_end=sql.SQL("h.slot_end"),
        pid=sql.SQL("h.pid"),
        started_at=sql.SQL("h.started_at"),
        ended_at=sql.SQL("h.ended_at"),
        outcome=read(sql.SQL("state.outcome")),
        exit_code=sql.SQL("h.exit_code"),
        signal=sql.SQL("h.signal"),
        duration_seconds=sql.SQL(
            "CASE WHEN state.outcome = 'abandoned' THEN NULL"
            # Epochs, not an interval: no overflow between far-off (hand-written) times.
            " ELSE (EXTRACT(EPOCH FROM COALESCE(h.ended_at, NOW()))"
            " - EXTRACT(EPOCH FROM h.started_at))::float8 END"
        ),
        truncated=sql.SQL("false"),
        **{name: read(sql.Identifier("h", name)) for name in _COLUMNS},
        **{name: tail_column("h", name) for name in TAILS},
    )
    query = sql.SQL(
        "SELECT {columns}"
        " FROM {history} AS h,"
        " LATERAL (SELECT CASE WHEN h.ended_at IS NOT NULL THEN h.outcome"
        " WHEN {held} THEN 'running' ELSE 'abandoned' END AS outcome) AS state"
        " WHERE h.started_at >= NOW() - make_interval(secs => %(since)s){key_filter}"
        " ORDER BY h.started_at DESC LIMIT %(limit)s"
    ).format(
        columns=columns,
        history=sql.Identifier(*history),
        held=still_held("h", locks),
        key_filter=sql.SQL("" if key is None else " AND h.lock_key = %(key)s"),
    )
    params = {"key": key, "since": since.total_seconds(), "limit": limit}
    return Exchange(query, params, _read_runs)


def _read_runs(rows: Rows) -> list[Run]:
    """The runs, their texts ``cut`` (``rows_of``), ``truncated`` where one was."""
    return [
        run._replace(truncated=any(was_cut(getattr(whole, name)) for name in _TEXTS))
        for whole, run in zip(map(Run._make, rows), rows_of(Run, *_TEXTS)(rows), strict=True)
    ]


def tail_column(run: str, column: str) -> sql.Composed:
    """A tail column (``TAILS``) of the history row ``run``, NULL when the table has none
    (read through the row as JSON), at most what the wrapper writes."""
    return sql.SQL("left(to_jsonb({}) ->> {}, {})").format(
        sql.Identifier(run), sql.Literal(column), sql.Literal(int(OUTPUT_TAIL.high))
    )


def latest(history: tuple[str, ...], locks: tuple[str, ...]) -> Exchange[list[Latest]]:
    """Per lock key with a schedule or lease row: its newest run, as ``runs`` derives it,
    and its newest successful run.  Index scans of ``(lock_key, started_at DESC)``: the
    cost grows with the number of keys, not with the history's length."""
    lease, slot = lease_key(""), schedule_key("")
    held = still_held("last", locks)
    columns = select_list(
        Latest._fields,
        key=read(sql.SQL("keys.lock_key")),
        run_id=sql.SQL("last.id"),
        started_at=sql.SQL("last.started_at"),
        ended_at=sql.SQL("last.ended_at"),
        outcome=sql.SQL(
            "CASE WHEN last.id IS NULL THEN NULL WHEN last.ended_at IS NOT NULL THEN {outcome}"
            " WHEN {held} THEN 'running' ELSE 'abandoned' END"
        ).format(outcome=read(sql.SQL("last.outcome")), held=held),
        duration_seconds=sql.SQL(
            "(EXTRACT(EPOCH FROM last.ended_at) - EXTRACT(EPOCH FROM last.started_at))::float8"
        ),
        host=read(sql.SQL("last.host")),
        last_success_started_at=sql.SQL("ok.started_at"),
        last_success_ended_at=sql.SQL("ok.ended_at"),
    )
    query = sql.SQL(
        "SELECT {columns}"
        " FROM (SELECT DISTINCT substr(key, length(CASE WHEN starts_with(key, {lease})"
        " THEN {lease} ELSE {slot} END) + 1) AS lock_key FROM {locks}"
        " WHERE starts_with(key, {lease}) OR starts_with(key, {slot})) AS keys"
        " LEFT JOIN LATERAL (SELECT * FROM {history} AS h WHERE h.lock_key = keys.lock_key"
        # An operator's event (a rerun, a pause) is no run: the newest run is before it.
        " AND COALESCE(h.outcome <> ALL({events}), true)"
        " ORDER BY h.started_at DESC LIMIT 1) AS last ON true"
        " LEFT JOIN LATERAL (SELECT h.started_at, h.ended_at FROM {history} AS h"
        " WHERE h.lock_key = keys.lock_key AND h.outcome = 'ok'"
        " ORDER BY h.started_at DESC LIMIT 1) AS ok ON true"
        " ORDER BY keys.lock_key"
    ).format(
        columns=columns,
        history=sql.Identifier(*history),
        locks=sql.Identifier(*locks),
        lease=sql.Literal(lease),
        slot=sql.Literal(slot),
        events=sql.Literal(list(operator_commands.OUTCOMES)),
    )
    return Exchange(query, {}, rows_of(Latest, "key", "outcome", "host"))


class Latest(NamedTuple):
    """A key's row of ``latest``; the run fields are None for a key that never ran."""

    key: str
    run_id: int | None
    started_at: datetime | None
    ended_at: datetime | None
    outcome: str | None
    duration_seconds: float | None
    host: str | None
    last_success_started_at: datetime | None
    last_success_ended_at: datetime | None


def known_key(history: tuple[str, ...], locks: tuple[str, ...], key: str) -> Exchange[bool]:
    """Whether ``key`` ever ran (history) or has a lock row."""
    query = sql.SQL(
        "SELECT EXISTS (SELECT FROM {history} WHERE lock_key = %(key)s)"
        " OR EXISTS (SELECT FROM {locks} WHERE key = ANY(%(rows)s))"
    ).format(history=sql.Identifier(*history), locks=sql.Identifier(*locks))
    params = {"key": key, "rows": [schedule_key(key), lease_key(key)]}
    return Exchange(query, params, read_flag)


def unstarted(history: tuple[str, ...], leases: Sequence[tuple[str, str]]) -> Exchange[list[bool]]:
    """For each ``(lock key, owner)`` of a held lease: whether its key's runs are recorded
    but none of its newest 100 history rows is a run of that owner still going (its run
    has not started: ``dislock.cli.lock_rows.waiting_for_group``).  An index scan each."""
    query = sql.SQL(
        "SELECT count(h.owner) > 0"
        " AND NOT COALESCE(bool_or(h.owner = l.owner AND h.ended_at IS NULL), false)"
        " FROM unnest(%(keys)s::text[], %(owners)s::text[]) WITH ORDINALITY"
        " AS l(lock_key, owner, n) LEFT JOIN LATERAL (SELECT owner, ended_at FROM {history} AS h"
        " WHERE h.lock_key = l.lock_key ORDER BY h.started_at DESC LIMIT 100) AS h ON true"
        " GROUP BY l.n ORDER BY l.n"
    ).format(history=sql.Identifier(*history))
    params = {"keys": [key for key, _ in leases], "owners": [owner for _, owner in leases]}
    return Exchange(query, params, lambda rows: [bool(flag) for (flag,) in rows])


class Recorded(NamedTuple):
    """The schedule a key's newest run recorded, and its zone."""

    cron: str
    cron_tz: str | None


def recorded_schedule(history: tuple[str, ...], key: str) -> Exchange[Recorded | None]:
    """The cron expression (and zone) recorded with ``key``'s newest run that had one."""
    columns = select_list(Recorded._fields, cron=read("cron"), cron_tz=read("cron_tz"))
    query = sql.SQL(
        "SELECT {} FROM {} WHERE lock_key = %(key)s AND cron IS NOT NULL"
        " ORDER BY started_at DESC LIMIT 1"
    ).format(columns, sql.Identifier(*history))
    read_rows = rows_of(Recorded, "cron", "cron_tz")
    return Exchange(query, {"key": key}, lambda rows: next(iter(read_rows(rows)), None))


def readings_of(
    history: tuple[str, ...], since: datetime, key: str | None
) -> Exchange[list[Reading]]:
    """How the runs since ``since`` (of ``key``, or of every key) read their schedule: one
    row per key, cron expression and zone, with the runs and hosts that read it so.  A
    schedule read in different zones puts several real fires into one slot (or none)."""
    host = read("host")
    columns = select_list(
        Reading._fields,
        key=read("lock_key"),
        cron=read("cron"),
        cron_tz=sql.SQL("coalesce({}, 'UTC')").format(read("cron_tz")),
        runs=sql.SQL("count(*)"),
        hosts=sql.SQL(
            "coalesce(substr(string_agg(DISTINCT {host}, ', ' ORDER BY {host}), 1, {most}), '')"
        ).format(host=host, most=sql.Literal(READ)),
    )
    # Grouped and ordered by position: ``cron`` names both a column read and the
    # table's own (GROUP BY would take the table's, ORDER BY the one read).
    query = sql.SQL(
        "SELECT {columns}"
        " FROM {table} WHERE started_at >= %(since)s AND cron IS NOT NULL"
        " AND (%(key)s::text IS NULL OR lock_key = %(key)s::text)"
        " GROUP BY 1, 2, 3 ORDER BY 1, 4 DESC, 2, 3"
    ).format(columns=columns, table=sql.Identifier(*history))
    read_readings = rows_of(Reading, "key", "cron", "cron_tz", "hosts")
    return Exchange(query, {"key": key, "since": since}, read_readings)


class Reading(NamedTuple):
    """One way the runs of a key read their schedule (a row of ``readings_of``)."""

    key: str
    cron: str
    cron_tz: str
    runs: int
    hosts: str


def disagreements(readings: Sequence[Reading]) -> dict[str, list[Reading]]:
    """The keys whose runs read their schedule in more than one way, with the readings."""
    by_key: dict[str, list[Reading]] = {}
    for reading in readings:
        by_key.setdefault(reading.key, []).append(reading)
    return {key: found for key, found in by_key.items() if len(found) > 1}


def describe_disagreement(key: str, readings: Sequence[Reading]) -> str:
    """One line for an operator: the key, each reading, and what to do."""
    ways = "; ".join(
        f"{printable(r.cron, limit=SHOWN_CHARS)} in {clip(r.cron_tz)} by {r.runs} run(s)"
        f" on {clip(r.hosts, 4 * SHOWN_CHARS)}"
        for r in readings
    )
    return (
        f"warning: the runs of {printable(key, limit=SHOWN_CHARS)} read its schedule"
        f" differently ({ways}): "
        "set the same CRON_TZ (and CRON_SCHEDULE) on every machine"
    )


def counts_budgets(lock_table: tuple[str, ...]) -> Exchange[bool]:
    """Whether this role may take a prune's room off the history budgets' counts in
    ``lock_table`` (a role granted only ``DELETE`` on the history may not)."""
    query = sql.SQL(
        "SELECT coalesce(has_table_privilege(to_regclass({}), 'UPDATE'), false)"
    ).format(sql.Literal(sql.Identifier(*lock_table).as_string(None)))
    return Exchange(query, {}, read_flag)


def prune(
    history: tuple[str, ...], older: timedelta, lock_table: tuple[str, ...] | None
) -> Exchange[int]:
    """Delete the runs that started longer than ``older`` ago; answers how many.  A pause
    still in force is kept however old: its slots would read as missed without it.  The
    roles' history budgets count the room it made (``lock_table``'s counts, unless None)."""
    from dislock.core.history_functions import ROW_BYTES, refund

    query = sql.SQL(
        "WITH gone AS (DELETE FROM {table} AS h"
        " WHERE h.started_at < NOW() - make_interval(secs => %(older)s)"
        " AND NOT (h.modes = {pause} AND h.outcome = {paused} AND h.slot_end > NOW()"
        " AND NOT EXISTS (SELECT FROM {table} AS later WHERE later.lock_key = h.lock_key"
        " AND later.modes = {pause} AND later.started_at > h.started_at))"
        " RETURNING h.lock_key, {bytes} AS bytes){refund} SELECT count(*) FROM gone"
    ).format(
        table=sql.Identifier(*history),
        bytes=sql.SQL(ROW_BYTES.format(h="h")),
        refund=sql.SQL(", refunded AS ({})").format(refund(lock_table, "gone"))
        if lock_table
        else sql.SQL(""),
        pause=sql.Literal(operator_commands.PAUSE_MODES),
        paused=sql.Literal(operator_commands.PAUSED),
    )
    return Exchange(query, {"older": older.total_seconds()}, read_value)
