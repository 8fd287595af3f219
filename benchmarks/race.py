"""Many wrappers racing one schedule slot at the same moment: exactly one may start.

The measure is correctness first (the count of starts), then what the race costs:
the time until every racer had its decision, and the WAL it wrote (a refused
racer should write none, so the floor is the winner's row and its bookkeeping).
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from benchmarks.rows import Row, met
from benchmarks.wrapper import editable_dislock, wrapper_env


def race_rows(url: str, processes: int) -> list[Row]:
    with tempfile.TemporaryDirectory() as tmp:
        starts = Path(tmp) / "starts"
        env = {**wrapper_env(url, "schedule"), "CRON_SCHEDULE": "0 0 1 1 *"}
        command = [editable_dislock(), "DATABASE_URL", "sh", "-c", f'echo started >> "{starts}"']
        with psycopg.connect(url, autocommit=True) as probe:
            wal_before = probe.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
            started = time.perf_counter()
            running = [subprocess.Popen(command, env=env) for _ in range(processes)]
            durations = []
            for process in running:
                process.wait()
                durations.append(time.perf_counter() - started)
            wal = probe.execute(
                "SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", wal_before
            ).fetchone()
        count = len(starts.read_text().splitlines()) if starts.exists() else 0
    wal_bytes = int(wal[0]) if wal is not None else -1
    return [
        Row(
            f"{processes} processes racing one schedule slot: starts",
            "{starts}",
            "exactly 1",
            met(count == 1, "MISSED"),
            {"starts": count},
        ),
        Row(
            "  time until every racer had its decision",
            "{all_ms:.0f} ms",
            "report",
            numbers={"all_ms": max(durations) * 1000},
        ),
        Row(
            "  WAL the whole race wrote (the winner's row and the lock-delay bookkeeping:"
            " a refused racer writes none)",
            "{wal_bytes:,} bytes",
            "report",
            numbers={"wal_bytes": wal_bytes},
        ),
    ]
