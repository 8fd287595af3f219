"""The mutual-exclusion checker: a ledger of critical sections, and a search for overlaps.

Workers record when each critical section started and ended with the database's
``clock_timestamp()`` (one clock for every process), and read-modify-write a
plain counter inside it.  Two sections of one key that overlap in time, or a
counter that lost increments, mean the lock let two holders in.
"""

from __future__ import annotations

from typing import Any

import psycopg

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS ledger (
    id bigserial PRIMARY KEY,
    lock_key text NOT NULL,
    holder text NOT NULL,
    started timestamptz NOT NULL,
    ended timestamptz
);
CREATE TABLE IF NOT EXISTS counters (lock_key text PRIMARY KEY, n bigint NOT NULL);
"""


def create(conn: psycopg.Connection[Any]) -> None:
    conn.execute(SCHEMA_SQL)


def overlaps(conn: psycopg.Connection[Any]) -> list[tuple[int, int, str]]:
    """Pairs of sections of one key whose [started, ended] intervals intersect."""
    rows = conn.execute(
        "SELECT a.id, b.id, a.lock_key FROM ledger a JOIN ledger b"
        " ON a.lock_key = b.lock_key AND a.id < b.id"
        " AND a.started < b.ended AND b.started < a.ended"
    ).fetchall()
    return [(int(a), int(b), str(key)) for a, b, key in rows]


def unfinished(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM ledger WHERE ended IS NULL").fetchone()
    assert row is not None
    return int(row[0])


def counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return {str(key): int(n) for key, n in conn.execute("SELECT lock_key, n FROM counters")}


def max_concurrent(conn: psycopg.Connection[Any], lock_key: str) -> int:
    """The most sections of ``lock_key`` ever open at one instant (the peak is at
    some section's start): 1 for a lock, at most N for an N-slot lease."""
    row = conn.execute(
        "SELECT coalesce(max(open), 0) FROM ("
        " SELECT count(*) AS open FROM ledger a JOIN ledger b"
        " ON a.lock_key = b.lock_key AND b.started <= a.started AND a.started < b.ended"
        " WHERE a.lock_key = %s GROUP BY a.id) AS at_start",
        (lock_key,),
    ).fetchone()
    assert row is not None
    return int(row[0])
