"""What fencing enforced by the database costs a writer: a table ``dislockctl fence``
guards against the same table unguarded.

The guard is a deferred constraint trigger: a check per changed row, as the
transaction commits, that reads the key's live lease row.  Both tables get the very
same transactions, each carrying the token with ``set_fencing_token``
(``set_config(..., true)``), so that the ratio is the guard's alone: a one-row
``INSERT`` in its own transaction (``BEGIN``, the token, the insert, ``COMMIT``: four
round trips and a durable commit), and a 10,000-row ``COPY`` in one.  The tables take
turns one transaction at a time; medians.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from benchmarks.rows import Row
from dislock.cli.admin import init_statements
from dislock.core.fencing import SQLSTATE, fence_statements, guard_sql
from dislock.core.rows import lease_key

SCHEMA = "bench_fence"
LOCK_TABLE = (SCHEMA, "key_value")
TABLES = {"guarded": (SCHEMA, "guarded"), "plain": (SCHEMA, "plain")}
"""The user's table, fenced by ``LOCK_KEY``'s lease, and its unguarded twin."""
LOCK_KEY = "bench"
TOKEN = 1
COPY_ROWS = 10_000
WARM_WRITES = 20
"""One-row writes per table before the timed ones (psycopg prepares the insert after 5)."""

Connection = psycopg.Connection[tuple[Any, ...]]


@contextmanager
def fenced_tables(url: str) -> Iterator[None]:
    """``bench_fence``: a lock table with the guard functions (``init --fencing``), a
    live lease of ``LOCK_KEY`` whose fence is ``TOKEN`` (inserted by hand, an hour
    long), and the two user tables, one of them fenced."""
    drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA))
    lease = sql.SQL(
        "INSERT INTO {} (key, value, expire_at, fence)"
        " VALUES (%s, 'bench', now() + interval '1 hour', %s)"
    ).format(sql.Identifier(*LOCK_TABLE))
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(drop)
        with admin.transaction():
            for statement in init_statements(LOCK_TABLE, fencing=True):
                admin.execute(statement)
            admin.execute(guard_sql(LOCK_TABLE))
            admin.execute(lease, (lease_key(LOCK_KEY), TOKEN))
            for table in TABLES.values():
                admin.execute(
                    sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, body text NOT NULL)").format(
                        sql.Identifier(*table)
                    )
                )
            for statement in fence_statements(LOCK_TABLE, TABLES["guarded"], LOCK_KEY):
                admin.execute(statement)
        _check_refused(admin)
    try:
        yield
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(drop)


def _check_refused(conn: Connection) -> None:
    """A write to the guarded table without the token is refused (else there would be
    nothing to measure)."""
    insert = sql.SQL("INSERT INTO {} (id, body) VALUES (0, 'no token')").format(
        sql.Identifier(*TABLES["guarded"])
    )
    try:
        with conn.transaction():
            conn.execute(insert)
    except psycopg.Error as error:
        if error.sqlstate == SQLSTATE:
            return
        raise
    raise RuntimeError("the fenced table took a write without a fencing token")


def _alternated(
    transaction: Callable[[str, int], float], rounds: int, warm: int
) -> dict[str, list[float]]:
    """Seconds of ``transaction(table, n)`` on each table, the tables taking turns
    (in the other order every round), after ``warm`` untimed rounds."""
    samples: dict[str, list[float]] = {name: [] for name in TABLES}
    order = list(TABLES)
    for n in range(warm + rounds):
        for name in order if n % 2 else reversed(order):
            seconds = transaction(name, n)
            if n >= warm:
                samples[name].append(seconds)
    return samples


def one_row_writes(conn: Connection, writes: int) -> dict[str, list[float]]:
    """Seconds per one-row ``INSERT`` transaction carrying the token, on each table."""
    from dislock import set_fencing_token

    inserts = {
        name: sql.SQL("INSERT INTO {} (id, body) VALUES (%s, 'one row')").format(
            sql.Identifier(*table)
        )
        for name, table in TABLES.items()
    }

    def write(name: str, n: int) -> float:
        started = time.perf_counter()
        with conn.transaction():
            set_fencing_token(conn, TOKEN)
            conn.execute(inserts[name], (n + 1,))
        return time.perf_counter() - started

    return _alternated(write, writes, WARM_WRITES)


def copies(conn: Connection, repeat: int) -> dict[str, list[float]]:
    """Seconds per ``COPY`` of ``COPY_ROWS`` rows in one transaction carrying the token,
    on each table, emptied before each (untimed, by a ``TRUNCATE`` with the token)."""
    from dislock import set_fencing_token

    data = "".join(f"{i}\tcopied row {i}\n" for i in range(1, COPY_ROWS + 1)).encode()

    def copy(name: str, n: int) -> float:
        table = sql.Identifier(*TABLES[name])
        with conn.transaction():
            set_fencing_token(conn, TOKEN)
            conn.execute(sql.SQL("TRUNCATE {}").format(table))
        started = time.perf_counter()
        with conn.transaction():
            set_fencing_token(conn, TOKEN)
            with conn.cursor().copy(sql.SQL("COPY {} (id, body) FROM STDIN").format(table)) as to:
                to.write(data)
        return time.perf_counter() - started

    return _alternated(copy, repeat, 1)


def _ratio_row(measure: str, samples: dict[str, list[float]], digits: int) -> Row:
    guarded, plain = (statistics.median(samples[name]) * 1000 for name in TABLES)
    return Row(
        measure,
        f"{{ratio:.2f}} ({{guarded_ms:.{digits}f}} ms / {{plain_ms:.{digits}f}} ms)",
        "report",
        numbers={"ratio": guarded / plain, "guarded_ms": guarded, "plain_ms": plain},
    )


def fence_rows(url: str, writes: int, repeat: int) -> list[Row]:
    """``writes`` one-row transactions and ``repeat`` copies on each table."""
    with fenced_tables(url), psycopg.connect(url, autocommit=True) as conn:
        written = one_row_writes(conn, writes)
        copied = copies(conn, repeat)
    return [
        _ratio_row(
            "fenced table (`dislockctl fence`): a one-row `INSERT` in its own transaction,"
            " token set by `set_config`: guarded / the same table unguarded",
            written,
            3,
        ),
        _ratio_row(f"  same, a {COPY_ROWS:,}-row `COPY` in one transaction", copied, 1),
    ]
