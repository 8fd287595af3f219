"""``dislockctl serve`` over a big fleet: how long a Prometheus scrape takes.

A fleet of hourly jobs with a long history, and runs landing between scrapes as
they would in production.  The target is a scrape well inside a scrape timeout
(250 ms at p95); the first scrape, which reads the whole history once, and the
status page are reported.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request

import psycopg

from benchmarks.rows import Row, met
from benchmarks.timing import median_ms
from dislock.core.table import create_table_sql

SERVE_FILL = """
INSERT INTO {history} (lock_key, modes, slot_end, owner, host, pid, started_at, ended_at,
                       outcome, exit_code, cron)
SELECT 'job-' || lpad(k::text, 4, '0'), 'schedule', slot + interval '1 hour',
       'host-' || (k %% 50) || ':' || r || ':0bad', 'host-' || (k %% 50), r,
       slot + make_interval(secs => k %% 7), slot + make_interval(secs => 20 + k %% 7 + r %% 13),
       CASE WHEN (k * r) %% 97 = 0 THEN 'failed' WHEN (k * r) %% 331 = 0 THEN 'lease_lost'
            ELSE 'ok' END,
       CASE WHEN (k * r) %% 97 = 0 THEN 3 WHEN (k * r) %% 331 = 0 THEN 75 ELSE 0 END,
       (k %% 60) || ' * * * *'
FROM generate_series(1, %(keys)s) AS k, generate_series(1, %(runs)s) AS r,
     LATERAL (SELECT date_trunc('hour', NOW()) - make_interval(hours => r)
                     + make_interval(mins => k %% 60) AS slot) AS s
ORDER BY r DESC, k
"""


SERVE_SIZES = {False: (1000, 1000, 40), True: (100, 100, 5)}
"""Keys, runs per key and scrapes of ``serve_rows``, full and quick."""


def serve_rows(url: str, keys: int, runs: int, scrapes: int) -> list[Row]:
    """``dislockctl serve`` over a fleet of ``keys`` hourly jobs with ``runs`` runs each:
    the first scrape, then scrapes while runs keep landing (ten between two scrapes)."""
    from dislock.core.history import create_history

    table, history = ("serve_locks",), ("serve_locks_history",)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS serve_locks, serve_locks_history")
        conn.execute(create_table_sql(table))
        for statement in create_history(history):
            conn.execute(statement)
        conn.execute(SERVE_FILL.format(history="serve_locks_history"), {"keys": keys, "runs": runs})
        conn.execute(
            "INSERT INTO serve_locks SELECT 'cronjob-lock:schedule:' || lock_key, owner, slot_end"
            " FROM (SELECT DISTINCT ON (lock_key) lock_key, owner, slot_end"
            " FROM serve_locks_history ORDER BY lock_key, started_at DESC) AS latest"
        )
        conn.execute("VACUUM ANALYZE serve_locks, serve_locks_history")
        env = {**os.environ, "DATABASE_URL": url, "LOCK_TABLE": "serve_locks"}
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dislock.cli.ctl",
                "DATABASE_URL",
                "serve",
                "--listen",
                "127.0.0.1:0",
            ],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stderr is not None
            found = re.search(r"(http://\S+/)", server.stderr.readline())
            assert found, "dislockctl serve did not start"
            base = found.group(1)

            def fetch(path: str) -> tuple[float, bytes]:
                started = time.perf_counter()
                with urllib.request.urlopen(base + path, timeout=120) as answer:
                    body = answer.read()
                return time.perf_counter() - started, body

            first, body = fetch("metrics")
            samples = body.count(b"\n") - body.count(b"\n#")
            steady = []
            for n in range(scrapes):
                conn.execute(
                    "INSERT INTO serve_locks_history (lock_key, modes, owner, host, pid,"
                    " started_at, ended_at, outcome, exit_code, cron)"
                    " SELECT 'job-' || lpad(k::text, 4, '0'), 'schedule', 'bench:1:0', 'bench',"
                    " 1, NOW(), NOW(), 'ok', 0, (k %% 60) || ' * * * *'"
                    " FROM (SELECT 1 + (%(n)s * 10 + i) %% %(keys)s AS k"
                    " FROM generate_series(1, 10) AS i) AS picked",
                    {"n": n, "keys": keys},
                )
                steady.append(fetch("metrics")[0])
            page = [fetch("")[0] for _ in range(max(3, scrapes // 4))]
        finally:
            server.terminate()
            server.wait(timeout=30)
    p95 = sorted(steady)[max(0, int(len(steady) * 0.95) - 1)]
    label = f"{keys} keys, {keys * runs:,} history rows"
    return [
        Row(
            f"`dislockctl serve` scrape of `/metrics`, {label} ({samples:,} samples):"
            f" median / p95 of {scrapes}, ten new runs between scrapes",
            "{median_ms:.0f} ms / {p95_ms:.0f} ms",
            "< 250 ms",
            met(p95 < 0.25),
            {"median_ms": median_ms(steady), "p95_ms": p95 * 1000},
        ),
        Row(
            "  first scrape after start (counts the history once)",
            "{first_ms:.0f} ms",
            "report",
            numbers={"first_ms": first * 1000},
        ),
        Row(
            "  status page `/`, all keys",
            "{median_ms:.0f} ms (median)",
            "report",
            numbers={"median_ms": median_ms(page)},
        ),
    ]
