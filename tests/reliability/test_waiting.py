"""Waiters and N-slot leases under contention, checked with the ledger."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import ledger

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def work_db(work_db: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The ledger connection (tests/reliability/conftest.py), with a table for the waits."""
    work_db.execute(
        "CREATE TABLE waits (holder text NOT NULL, slot_key text, waited float8 NOT NULL)"
    )
    return work_db


def run_waiters(
    url: str, schema: str, *, processes: int, threads: int, slots: int, wait: float, hold: float
) -> None:
    start = time.time() + 3.0  # every thread connected and ready before anyone locks
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.reliability.wait_worker",
                *("--url", url, "--schema", schema, "--key", "shared"),
                *("--threads", str(threads), "--slots", str(slots)),
                *("--wait", str(wait), "--hold", str(hold), "--start", str(start)),
                *("--holder", f"p{n}"),
            ],
            cwd=ROOT,
        )
        for n in range(processes)
    ]
    for worker in workers:
        assert worker.wait(timeout=300) == 0


def waits(conn: psycopg.Connection[Any]) -> list[tuple[str, str | None, float]]:
    return [(str(h), k, float(w)) for h, k, w in conn.execute("SELECT * FROM waits")]


def test_twenty_waiters_on_one_lease_all_run_within_their_wait_and_never_overlap(
    database_url: str, lock_table: tuple[str, str], work_db: psycopg.Connection[Any]
) -> None:
    wait = 60.0  # 20 x 100 ms of work, with room for a loaded 2-core machine
    run_waiters(database_url, lock_table[0], processes=4, threads=5, slots=1, wait=wait, hold=0.1)
    results = waits(work_db)
    assert len(results) == 20
    assert all(key is not None for _, key, _ in results), results  # nobody gave up
    assert max(waited for _, _, waited in results) <= wait
    assert ledger.unfinished(work_db) == 0
    assert ledger.overlaps(work_db) == []
    assert ledger.max_concurrent(work_db, "shared") == 1


@pytest.mark.slow
def test_five_slots_fifty_contenders_never_more_than_five_and_slots_reused(
    database_url: str, lock_table: tuple[str, str], work_db: psycopg.Connection[Any]
) -> None:
    run_waiters(database_url, lock_table[0], processes=5, threads=10, slots=5, wait=120.0, hold=0.1)
    results = waits(work_db)
    assert len(results) == 50
    assert all(key is not None for _, key, _ in results), results
    assert ledger.unfinished(work_db) == 0
    assert 2 <= ledger.max_concurrent(work_db, "shared") <= 5
    # All five slots were used, each by several holders in turn.
    keys = [key for _, key, _ in results]
    assert len(set(keys)) == 5
    assert min(keys.count(key) for key in set(keys)) >= 2
