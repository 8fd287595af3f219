"""The PostgreSQL the benchmarks run against, and readings of what it spent.

An embedded PostgreSQL 18 started for the run (or ``BENCH_DATABASE_URL``), with
the lock table created.  The server's CPU is read from ``/proc`` when the
server is a process of this machine: what the herd costs the server.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from dislock.core.table import create_table_sql
from tests.support.postgres import postgres_url

BARE_TABLE = "key_value_bare"
"""A lock table without the functions (made by hand, or by dislock 0.1.0)."""


def create_lock_table(
    conn: psycopg.Connection[tuple[object, ...]],
    table: tuple[str, str],
    *,
    functions: bool = True,
) -> None:
    """``table`` (schema, name) as ``dislockctl init`` makes it: with the lock
    functions beside it, unless ``functions`` is false."""
    from dislock.core.protocol import protocol_sql

    conn.execute(create_table_sql(table))
    if functions:
        conn.execute(protocol_sql(table))


@contextmanager
def bench_database() -> Iterator[str]:
    """The URL of the server for the run, its ``key_value`` lock table created as
    ``init`` does, and ``key_value_bare`` without the functions."""
    with postgres_url("BENCH_DATABASE_URL") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            create_lock_table(conn, ("public", "key_value"))
            create_lock_table(conn, ("public", BARE_TABLE), functions=False)
        yield url


def _proc_stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (state first)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def server_cpu_reader(url: str) -> Callable[[], float] | None:
    """A reading of the CPU seconds the server's postmaster and its exited backends
    have used (``utime + stime + cutime + cstime``): every connection the herd opens,
    refused ones included, is a backend that the postmaster forks, reaps and so
    counts.  None when the server is not a process of this machine."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        try:  # (while the backend lives)
            postmaster = int(_proc_stat(int(row[0]) if row else -1)[1])
            _proc_stat(postmaster)
        except (OSError, ValueError, IndexError):
            return None
    ticks = os.sysconf("SC_CLK_TCK")

    def read() -> float:
        fields = _proc_stat(postmaster)
        return sum(int(fields[i]) for i in (11, 12, 13, 14)) / ticks

    return read


def backends_gone(url: str, role: str, timeout: float = 30.0) -> None:
    """Wait until ``role`` has no backend left, so that each was reaped (and counted)."""
    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", [role]
            ).fetchone()
            if row is not None and row[0] == 0:
                break
            time.sleep(0.05)
    time.sleep(0.2)  # the postmaster reaps on SIGCHLD, a moment after the exit
