"""Run history: the table, the two exchanges a run sends to it, and its outcome.

Opt-in (``LockContext.history``).  A run that got its locks inserts one row as it
starts and updates it as it ends, on the database clock.  Writing history never
fails or holds up the job (each statement bounded by ``HISTORY_TIMEOUT``, a
failure logged), but for the end: refused for a reason worth waiting out
(``retry_end``), it is sent again within the connect patience, lest a run whose
database went away read as ``abandoned``.

The table is ``<table>_history`` unless named otherwise (``create_history``): one
row per run, of its ``lock_key`` (not the row key), ``ended_at`` NULL while it runs
or when its machine died; indexed for one key's runs newest first, for every key's
(and pruning), and for a key's pauses.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple

from psycopg import sql

from dislock.core.after import SUCCEEDED, success_notice
from dislock.core.config import MAX_IDENTIFIER_BYTES, check_table_parts
from dislock.core.errors import MaxRuntimeExceeded
from dislock.core.exchange import Exchange, Rows, read_flag
from dislock.core.operator_commands import OUTCOMES as EVENTS
from dislock.core.operator_commands import PAUSE_MODES

HISTORY_TIMEOUT = 2.0
"""Seconds a history statement may take before it is cancelled and logged."""

OUTCOMES = ("ok", "failed", "lease_lost", "killed", "timed_out", "late", *EVENTS)
"""What the end statement records (``late``: a slot not started past its deadline;
then events, not runs); ``running`` and ``abandoned`` are derived when reading."""

SUFFIX = "_history"

STARTED = ("lock_key", "modes", "slot_end", "owner", "host", "pid", "started_at", "cron", "cron_tz")
"""The columns a run's start writes: all a granted role may insert (not ``id``,
which the table numbers, so that no role can take another run's number)."""

ENDED = ("ended_at", "outcome", "exit_code", "signal")
"""The columns every run's end writes."""

TAILS = ("stdout_tail", "stderr_tail")
"""The columns of an output's tail, written only by the end of a failed run whose
tail was asked for: a table (or grant) made before them records every other run."""


def history_table(
    table_parts: Sequence[str], explicit: Sequence[str] | None = None
) -> tuple[str, ...]:
    """The history table of a lock table: ``explicit``, or ``<table>_history``
    in the lock table's schema."""
    if explicit:
        return check_table_parts(explicit)
    *schema, name = table_parts
    return check_table_parts((*schema, f"{name}{SUFFIX}"))


def _index_text(history: tuple[str, ...], what: str) -> str:
    # PostgreSQL truncates longer names: keep the distinguishing suffix.
    return f"{history[-1][: MAX_IDENTIFIER_BYTES - len(what) - 1]}_{what}"


def _index_id(history: tuple[str, ...], what: str) -> sql.Identifier:
    return sql.Identifier(_index_text(history, what))


def create_history(history: tuple[str, ...]) -> list[sql.Composed]:
    """Idempotent DDL for the history table and its indexes (and its schema)."""
    table = sql.Identifier(*history)
    statements: list[sql.Composed] = []
    if len(history) == 2:
        statements.append(
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(history[0]))
        )
    statements += [
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {table} ("
            "id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " lock_key text NOT NULL, modes text NOT NULL, slot_end timestamptz,"
            " owner text NOT NULL, host text NOT NULL, pid integer NOT NULL,"
            " started_at timestamptz NOT NULL, ended_at timestamptz,"
            " outcome text, exit_code integer, signal integer,"
            " cron text, cron_tz text)"
            # The end statement updates unindexed columns only: room for HOT updates.
            " WITH (fillfactor = 90)"
        ).format(table=table),
        add_tail_columns(history),
        sql.SQL("CREATE INDEX IF NOT EXISTS {name} ON {table} (lock_key, started_at DESC)").format(
            name=_index_id(history, "key_started"), table=table
        ),
        sql.SQL("CREATE INDEX IF NOT EXISTS {name} ON {table} (started_at)").format(
            name=_index_id(history, "started"), table=table
        ),
        # A key's pauses among its runs (``dislock.core.operator_commands``): ``modes`` is written
        # once, as a row is inserted, so the end statement's updates stay HOT.
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS {name} ON {table} (lock_key, started_at)"
            " WHERE modes = {pause}"
        ).format(name=_index_id(history, "pauses"), table=table, pause=sql.Literal(PAUSE_MODES)),
    ]
    return statements


def up_to_date(history: tuple[str, ...]) -> Exchange[bool]:
    """Whether the existing table ``history`` has everything ``create_history`` makes."""
    index = sql.Identifier(*history[:-1], _index_text(history, "pauses"))
    query = sql.SQL(
        "SELECT to_regclass({index}) IS NOT NULL AND (SELECT count(*) = {n} FROM pg_attribute"
        " WHERE attrelid = to_regclass({table}) AND attname IN ({tails}) AND NOT attisdropped)"
        " AS up_to_date"
    ).format(
        index=sql.Literal(index.as_string(None)),
        table=sql.Literal(sql.Identifier(*history).as_string(None)),
        n=sql.Literal(len(TAILS)),
        tails=sql.SQL(", ").join(map(sql.Literal, TAILS)),
    )
    return Exchange(query, {}, read_flag)


def add_tail_columns(history: tuple[str, ...]) -> sql.Composed:
    """The ``TAILS`` columns, on a table made before them too (idempotent)."""
    columns = sql.SQL(", ").join(
        sql.SQL("ADD COLUMN IF NOT EXISTS {} text").format(sql.Identifier(column))
        for column in TAILS
    )
    return sql.SQL("ALTER TABLE {} {}").format(sql.Identifier(*history), columns)


# History is telemetry: its writes commit asynchronously (``synchronous_commit``
# off for their own transaction only, set by the statement itself), so that a
# run pays a round trip for them, not a wait for the WAL to reach the disk.  A
# server crash can lose the last fraction of a second of history; lock rows are
# written by other statements, durably as ever.
ASYNC_COMMIT = sql.SQL("(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit")


def last_success_query(history: tuple[str, ...], lock_key: sql.Composable) -> sql.Composed:
    """The newest successful run of ``lock_key`` (its start, slot end, cron and zone):
    the index of a key's runs newest first, read until its first ``ok``."""
    return sql.SQL(
        "SELECT done.started_at, done.slot_end, done.cron, done.cron_tz FROM {} AS done"
        " WHERE done.lock_key = {} AND done.outcome = {} ORDER BY done.started_at DESC LIMIT 1"
    ).format(sql.Identifier(*history), lock_key, sql.Literal(SUCCEEDED))


@lru_cache(maxsize=64)
def _start_query(history: tuple[str, ...]) -> sql.Composed:
    values = [sql.SQL("NOW()") if c == "started_at" else sql.Placeholder(c) for c in STARTED]
    return sql.SQL(
        "WITH succeeded AS ({last}), run AS (INSERT INTO {} ({}) SELECT {} FROM {async_commit}"
        " RETURNING id) SELECT run.id, succeeded.* FROM run LEFT JOIN succeeded ON true"
    ).format(
        sql.Identifier(*history),
        sql.SQL(", ").join(map(sql.Identifier, STARTED)),
        sql.SQL(", ").join(values),
        last=last_success_query(history, sql.Placeholder("lock_key")),
        async_commit=ASYNC_COMMIT,
    )


@lru_cache(maxsize=64)
def _end_query(history: tuple[str, ...], late: bool = False, tails: bool = False) -> sql.Composed:
    # A run's end is written once: sent again after a lost answer, it changes nothing.
    # ``late``: an end kept on the host (``dislock.core.unrecorded``), at the time the
    # run really ended rather than the statement's.
    return sql.SQL(
        "UPDATE {} SET ended_at = {ended_at}, outcome = %(outcome)s, exit_code = %(exit_code)s,"
        " signal = %(signal)s{tails} FROM {async_commit} WHERE id = %(id)s AND ended_at IS NULL"
        " RETURNING {notice}"
    ).format(
        sql.Identifier(*history),
        ended_at=sql.SQL("%(ended_at)s" if late else "NOW()"),
        tails=sql.SQL(
            ", stdout_tail = %(stdout_tail)s, stderr_tail = %(stderr_tail)s" if tails else ""
        ),
        async_commit=ASYNC_COMMIT,
        notice=success_notice(),
    )


def read_run_id(rows: Rows) -> int:
    """The answer of ``start``: the new run's id."""
    (row,) = rows
    return int(row[0])


class RunStart(NamedTuple):
    """The answer of ``start``: the new run's id, and the key's last successful run
    before it (``last_success_query``'s row; None: none, or history functions older
    than this answer, which return the id alone)."""

    run_id: int
    last: tuple[datetime, datetime | None, str | None, str | None] | None = None


def read_run_start(rows: Rows) -> RunStart:
    (row,) = rows
    if len(row) < 5 or row[1] is None:
        return RunStart(int(row[0]))
    return RunStart(int(row[0]), (row[1], row[2], row[3], row[4]))


def read_nothing(rows: Rows) -> None:
    """The answer of ``end``: nothing to read (the wake-up it returns is for others)."""


def start(
    history: tuple[str, ...],
    *,
    lock_key: str,
    modes: Sequence[str],
    slot_end: Any,
    owner: str,
    host: str,
    pid: int,
    cron: str | None,
    cron_tz: str | None = None,
) -> Exchange[RunStart]:
    """Insert a run's row as it starts, on the database clock; answers the run's id and
    the key's last success before it."""
    params = {
        "lock_key": lock_key,
        "modes": ",".join(modes),
        "slot_end": slot_end,
        "owner": owner,
        "host": host,
        "pid": pid,
        "cron": cron,
        "cron_tz": cron_tz,
    }
    from dislock.core import history_functions

    plain = Exchange(_start_query(history), params, read_run_start)
    return history_functions.via(history, "start", plain)


def end(history: tuple[str, ...], run_id: int, run_end: RunEnd) -> Exchange[None]:
    """Complete the row of run ``run_id`` with how it ended, on the database clock."""
    from dislock.core import history_functions

    query = _end_query(history, tails=run_end.has_tail)
    plain = Exchange(query, {"id": run_id, **run_end.params()}, read_nothing)
    return history_functions.via(history, "end", plain)


def without_tail(error: BaseException) -> bool:
    """Whether an end statement that failed with ``error`` is worth sending again
    without the output's tail: the table has no column for it, or the role may not
    write it (made or granted before it)."""
    # undefined_column, insufficient_privilege (a refusal that has nothing to do with
    # the tail is refused again, and then reported as any refused end is)
    return getattr(error, "sqlstate", None) in ("42703", "42501")


def late_end(
    history: tuple[str, ...], run_id: int, run_end: RunEnd, ended_at: datetime
) -> Exchange[None]:
    """Complete the row of run ``run_id`` with an end that could not be recorded
    when it happened (``dislock.core.unrecorded``), at ``ended_at``."""
    params = {
        "id": run_id,
        "ended_at": ended_at,
        **run_end._replace(stdout_tail=None, stderr_tail=None).params(),
    }
    from dislock.core import history_functions

    plain = Exchange(_end_query(history, late=True), params, read_nothing)
    return history_functions.via(history, "end", plain)


def missing_table(error: BaseException) -> bool:
    """Whether a history statement failed because its table does not exist."""
    return getattr(error, "sqlstate", None) == "42P01"  # undefined_table


def retry_end(error: BaseException) -> bool:
    """Whether an end statement that failed with ``error`` is worth sending again
    once a connection opens (the server was down, restarting or full)."""
    from dislock.core.patience import is_transient

    return is_transient(error)


class RunEnd(NamedTuple):
    """How a run ended, as the end statement records it."""

    outcome: str
    exit_code: int | None = None
    signal: int | None = None
    stdout_tail: str | None = None
    stderr_tail: str | None = None
    """The end of the command's output, for a failed run (``dislock.core.output_tail``)."""

    @property
    def has_tail(self) -> bool:
        return self.stdout_tail is not None or self.stderr_tail is not None

    def params(self) -> dict[str, object]:
        """The end statement's parameters (the tail's only when it has one)."""
        found = self._asdict()
        if not self.has_tail:
            del found["stdout_tail"], found["stderr_tail"]
        return found


def end_of_command(
    returncode: int | None, status: int, *, lease_lost: bool, timed_out: bool = False
) -> RunEnd:
    """The end of a wrapped command: its raw return code (negative: killed by that
    signal; None: it never started), the status the wrapper returns, whether its
    lease was lost, and whether it ran past its ``max_runtime_seconds``."""
    killed_by = -returncode if returncode is not None and returncode < 0 else None
    if timed_out:
        return RunEnd("timed_out", status, killed_by)
    if lease_lost:
        return RunEnd("lease_lost", status, killed_by)
    if killed_by is not None:
        return RunEnd("killed", status, killed_by)
    return RunEnd("ok" if status == 0 else "failed", status)


def end_of_block(error: BaseException | None, *, lease_lost: bool) -> RunEnd:
    """The end of a block guarded by ``acquire_locks``."""
    if isinstance(error, MaxRuntimeExceeded):
        return RunEnd("timed_out")
    if lease_lost:
        return RunEnd("lease_lost")
    return RunEnd("ok") if error is None else RunEnd("failed")
