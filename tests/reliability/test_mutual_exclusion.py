"""Many processes, one lock: the ledger must show no overlap and no lost start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock.core.protocol import ARGUMENTS, function
from tests.support import ledger

ROOT = Path(__file__).resolve().parents[2]


def run_workers(
    count: int, mode: str, url: str, schema: str, keys: list[str], rounds: int, *extra: str
) -> None:
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.reliability.worker",
                mode,
                "--url",
                url,
                "--schema",
                schema,
                "--keys",
                *keys,
                "--rounds",
                str(rounds),
                "--holder",
                f"w{n}",
                *extra,
            ],
            cwd=ROOT,
        )
        for n in range(count)
    ]
    try:
        for worker in workers:
            assert worker.wait(timeout=600) == 0
    finally:  # one worker failed: the others must not outlive the test
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()


def seed_counters(conn: psycopg.Connection[Any], keys: list[str]) -> None:
    for key in keys:
        conn.execute("INSERT INTO counters VALUES (%s, 0)", (key,))


@pytest.mark.slow
def test_lease_stress_has_no_overlap_and_loses_no_increment(
    database_url: str, lock_table: tuple[str, str], work_db: psycopg.Connection[Any]
) -> None:
    keys, workers, rounds = ["alpha", "beta"], 8, 100
    seed_counters(work_db, keys)
    run_workers(workers, "lease", database_url, lock_table[0], keys, rounds)

    assert ledger.unfinished(work_db) == 0
    assert ledger.overlaps(work_db) == []
    assert sum(ledger.counts(work_db).values()) == workers * rounds
    assert ledger.counts(work_db) == {"alpha": workers * rounds // 2, "beta": workers * rounds // 2}


def test_checker_catches_a_lock_without_its_expiry_guard(
    database_url: str, lock_table: tuple[str, str], work_db: psycopg.Connection[Any]
) -> None:
    keys, workers, rounds = ["alpha"], 4, 5
    seed_counters(work_db, keys)
    work_db.execute("CREATE TABLE inside (holder text NOT NULL)")
    # The worker breaks the plain statement: the table must have no lock functions.
    with psycopg.connect(database_url, autocommit=True) as admin:
        for name in ARGUMENTS:
            admin.execute(
                sql.SQL("DROP FUNCTION IF EXISTS {} CASCADE").format(function(lock_table, name))
            )
    # Each worker's first section waits for a second one inside (worker.meet): the
    # overlap is made to happen, not hoped for from the scheduler.
    run_workers(
        workers, "lease", database_url, lock_table[0], keys, rounds, "--broken", "--meet", "2"
    )

    assert ledger.overlaps(work_db), "the checker missed overlapping critical sections"
    assert ledger.counts(work_db)["alpha"] < workers * rounds  # and increments were lost


@pytest.mark.slow
def test_schedule_race_one_start_per_slot_none_lost(
    database_url: str, lock_table: tuple[str, str], work_db: psycopg.Connection[Any]
) -> None:
    workers, slots = 16, 30
    work_db.execute("CREATE TABLE starts (slot_end timestamptz NOT NULL, holder text NOT NULL)")
    work_db.execute("CREATE TABLE ready (at timestamptz NOT NULL DEFAULT clock_timestamp())")
    # The workers agree on slot 0 once all of them are up (see worker.agreed_start).
    run_workers(
        workers, "schedule", database_url, lock_table[0], ["tick"], slots, "--workers", str(workers)
    )
    row = work_db.execute(
        "SELECT ceil(extract(epoch FROM max(at)))::float8 + 1 FROM ready"
    ).fetchone()
    assert row is not None
    start = float(row[0])

    per_slot = work_db.execute(
        "SELECT extract(epoch FROM slot_end)::bigint, count(*) FROM starts GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert all(count == 1 for _, count in per_slot), [row for row in per_slot if row[1] != 1]
    # Slot k is fired just after second start+k and ends at start+k+1.  A worker
    # that a loaded machine held up into the last quarter of a slot starts in the
    # next one (its early fire, EARLY_FIRE_TOLERANCE): after the last slot, that is
    # a slot of its own, not a lost or doubled one.
    expected = list(range(int(start) + 2, int(start) + slots + 2))
    assert [slot_end for slot_end, _ in per_slot][:slots] == expected
