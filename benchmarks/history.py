"""Run history: what recording costs a run, and how fast ``history``/``missed`` answer.

The floor of recording is the same ``acquire_locks`` lease run with history
off, timed alternately on one warm connection (and whole CLI runs with
``LOCK_HISTORY`` 1 against 0).  The pause check is compared with the acquiring
upsert as it was before pauses.  The queries run against a big history table,
where only its indexes keep them fast (the plans are printed to stderr).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

from benchmarks.cycle import cycle_context
from benchmarks.rows import Row, met
from benchmarks.timing import ROUNDS, interleaved, median_ms
from benchmarks.wrapper import editable_dislock, wrapper_env
from dislock.cli.sending import send
from dislock.core.exchange import Exchange
from dislock.core.lock_statements import statements as lock_statements

HISTORY_ROWS = 1_000_000
HISTORY_KEYS = 1_000

# The acquiring upsert as it was before pauses: no pause read, same answer.
UNCHECKED_ACQUIRE = (
    b"INSERT INTO key_value AS held (key, value, expire_at)"
    b" VALUES (%(key)s, %(owner)s, NOW() + make_interval(secs => %(ttl)s))"
    b" ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value,"
    b" expire_at = EXCLUDED.expire_at WHERE held.expire_at <= NOW() RETURNING NULL::bigint"
)

BIG_HISTORY = (
    "INSERT INTO key_value_history (lock_key, modes, slot_end, owner, host, pid,"
    " started_at, ended_at, outcome, exit_code, cron)"
    " SELECT 'job-' || (n %% %(keys)s), 'schedule',"
    " date_trunc('hour', NOW()) - make_interval(hours => n / %(keys)s) + interval '1 hour',"
    " 'host:1:ab', 'host-' || (n %% 50), n,"
    " date_trunc('hour', NOW()) - make_interval(hours => n / %(keys)s),"
    " date_trunc('hour', NOW()) - make_interval(hours => n / %(keys)s) + interval '2 s',"
    " CASE WHEN (n / %(keys)s) %% 10 = 0 THEN 'failed' ELSE 'ok' END,"
    " CASE WHEN (n / %(keys)s) %% 10 = 0 THEN 1 ELSE 0 END, '0 * * * *'"
    " FROM generate_series(0, %(rows)s - 1) AS n"
)
"""``HISTORY_KEYS`` keys, hourly runs going back as far as ``rows`` needs, every
tenth run of each key failed."""


def history_cycles(url: str, cycles: int) -> tuple[list[float], list[float]]:
    """Seconds per ``acquire_locks`` lease run on a warm connection, history off and
    on, each run timed on its own and the two kinds alternated, so that the load
    of a shared machine hits both alike and medians drop its spikes."""
    from dislock import acquire_locks, keep_connected

    base = _fields(cycle_context(url))
    off = type(cycle_context(url))(**{**base, "lock_key": "bench-history-off"})
    on = type(off)(**{**base, "lock_key": "bench-history-on", "history": True})
    samples: tuple[list[float], list[float]] = ([], [])
    with keep_connected(url):
        for context in (off, on):  # warm-up
            with acquire_locks(context, ["lease"]):
                pass
        for n in range(cycles):
            for which in (0, 1) if n % 2 else (1, 0):
                started = time.perf_counter()
                with acquire_locks((off, on)[which], ["lease"]):
                    pass
                samples[which].append(time.perf_counter() - started)
    return samples


def _fields(context: Any) -> dict[str, Any]:
    return {f.name: getattr(context, f.name) for f in dataclasses.fields(context) if f.init}


def cli_history_ms(url: str, repeat: int) -> tuple[float, float]:
    """Median whole CLI runs, ``LOCK_HISTORY=0`` and ``1``, interleaved."""
    ours = [editable_dislock()]

    def env(flag: str) -> Callable[[], dict[str, str]]:
        # Without CRON_SCHEDULE, which a lease-only run with history would
        # also check and record (importing croniter, ~5 ms).
        def make() -> dict[str, str]:
            settings = {**wrapper_env(url, "lease"), "LOCK_HISTORY": flag}
            del settings["CRON_SCHEDULE"]
            return settings

        return make

    cli = interleaved(
        {
            "off": ([*ours, "DATABASE_URL", "true"], env("0")),
            "on": ([*ours, "DATABASE_URL", "true"], env("1")),
        },
        repeat,
    )
    return median_ms(cli["off"]), median_ms(cli["on"])


def pause_check_cost(conn: psycopg.Connection[Any], cycles: int) -> tuple[float, float]:
    """Median acquire + release by hand: the upsert without the pause check, and today's."""
    statements = lock_statements(("key_value",))
    queries = statements.queries
    checked, release = queries.acquire_for.as_bytes(conn), queries.release.as_bytes(conn)
    key = "cronjob-lock:lease:bench-pause"
    acquire_params = statements.acquire_for(key, "bench", 60.0).params
    release_params = statements.release(key, "bench", "bench-pause").params

    pause_samples: tuple[list[float], list[float]] = ([], [])
    for n in range(cycles):
        for which in (0, 1) if n % 2 else (1, 0):
            started = time.perf_counter()
            conn.execute((UNCHECKED_ACQUIRE, checked)[which], acquire_params)
            conn.execute(release, release_params)
            pause_samples[which].append(time.perf_counter() - started)
    without_check, with_check = (statistics.median(samples) for samples in pause_samples)
    return without_check, with_check


def query_ms(run: Callable[[], object]) -> float:
    run()  # warm the cache
    samples = []
    for _ in range(9):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return median_ms(samples)


def explain(conn: psycopg.Connection[Any], exchange: Exchange[Any]) -> list[Any]:
    """The plan of ``exchange``'s statement with its parameters."""
    return conn.execute(b"EXPLAIN " + exchange.query.as_bytes(conn), exchange.params).fetchall()


def history_rows(url: str, cycles: int, rows: int) -> list[Row]:
    from dislock.cli.runs import missed_slots, run_history
    from dislock.core import operator_commands
    from dislock.core.history import create_history

    history = ("key_value_history",)
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        conn.execute("DROP TABLE IF EXISTS key_value_history")
        for statement in create_history(history):
            conn.execute(statement)
        off_samples, on_samples = history_cycles(url, cycles * ROUNDS)
        off, on = statistics.median(off_samples), statistics.median(on_samples)
        # The CLI, end to end: LOCK_HISTORY=1 against 0, interleaved.
        cli_off, cli_on = cli_history_ms(url, max(cycles // 10, 3))
        # The pause check rides in the acquiring statement: the upsert as it was
        # before pauses, against today's, sent by hand (acquire + release).
        without_check, with_check = pause_check_cost(conn, cycles * ROUNDS)

        conn.execute("TRUNCATE key_value_history")
        conn.execute(BIG_HISTORY, {"keys": HISTORY_KEYS, "rows": rows})
        conn.execute("VACUUM ANALYZE key_value_history")
        locks = ("key_value",)

        by_key = run_history.runs(history, locks, "job-7", timedelta(hours=24), 100)
        every = run_history.runs(history, locks, None, timedelta(hours=24), 100)
        key_ms = query_ms(lambda: send(conn, by_key))
        all_ms = query_ms(lambda: send(conn, every))

        def missed() -> object:
            (now,) = conn.execute("SELECT NOW()").fetchone()  # type: ignore[misc]
            since = now - timedelta(hours=24)
            starts = send(conn, missed_slots.starts(history, locks, "job-7", since))
            pauses = send(conn, operator_commands.pauses(history, "job-7", since))
            slots = list(missed_slots.schedule_slots("0 * * * *", since, now))
            return missed_slots.slot_states(
                slots,
                [
                    missed_slots.Attempt(
                        row.started_at, row.slot_end, row.outcome, bool(row.running)
                    )
                    for row in starts
                    if row.started_at is not None
                ],
                now=now,
                pauses=operator_commands.pause_spans(pauses),
            )

        missed_ms = query_ms(missed)
        # Per key: newest run and newest success (what an exporter reads per scrape).
        conn.execute(
            "INSERT INTO key_value SELECT 'cronjob-lock:schedule:job-' || n, 'host:1:ab',"
            " NOW() + interval '1 hour' FROM generate_series(0, %s - 1) AS n"
            " ON CONFLICT DO NOTHING",
            (HISTORY_KEYS,),
        )
        latest = run_history.latest(history, locks)
        latest_ms = query_ms(lambda: send(conn, latest))
        conn.execute("DELETE FROM key_value WHERE key LIKE 'cronjob-lock:schedule:job-%'")
        plans = {
            "history KEY": explain(conn, by_key),
            "history": explain(conn, every),
        }
        for name, plan in plans.items():
            print(f"EXPLAIN {name}:\n" + "\n".join(str(line[0]) for line in plan), file=sys.stderr)
        conn.execute("DROP TABLE key_value_history")
    index_used = all("key_value_history_" in str(plan) for plan in plans.values())
    return [
        Row(
            "run history on: added time per run, `acquire_locks` lease run on a warm connection"
            " (one INSERT as it starts, one UPDATE as it ends)",
            "{added_ms:.3f} ms ({on_ms:.3f} ms / {off_ms:.3f} ms)",
            "≤ 1 ms",
            met(on - off <= 0.001),
            {"added_ms": (on - off) * 1000, "on_ms": on * 1000, "off_ms": off * 1000},
        ),
        Row(
            "  same through the CLI, `LOCK_HISTORY=1` against `0` (medians of whole runs)",
            "{added_ms:.1f} ms ({on_ms:.0f} ms / {off_ms:.0f} ms)",
            "report",
            numbers={"added_ms": cli_on - cli_off, "on_ms": cli_on, "off_ms": cli_off},
        ),
        Row(
            "pause check folded into the acquisition: acquire + release by hand, today's upsert"
            " / the upsert without the check",
            "{ratio:.2f} ({with_ms:.3f} ms / {without_ms:.3f} ms)",
            "report (no extra round trip)",
            numbers={
                "ratio": with_check / without_check,
                "with_ms": with_check * 1000,
                "without_ms": without_check * 1000,
            },
        ),
        Row(
            f"`history KEY` (24 h, 100 runs) with {rows:,} history rows",
            "{query_ms:.1f} ms",
            "< 200 ms",
            met(key_ms < 200),
            {"query_ms": key_ms},
        ),
        Row(
            f"`history` (every key, 24 h, newest 100) with {rows:,} rows",
            "{query_ms:.1f} ms",
            "< 200 ms",
            met(all_ms < 200),
            {"query_ms": all_ms},
        ),
        Row(
            f"`missed KEY` (hourly, 24 h) with {rows:,} rows",
            "{query_ms:.1f} ms",
            "< 200 ms",
            met(missed_ms < 200),
            {"query_ms": missed_ms},
        ),
        Row(
            f"newest run and newest success of each of {HISTORY_KEYS:,} keys"
            f" (`dislock.cli.runs.run_history.latest`) with {rows:,} rows",
            "{query_ms:.1f} ms",
            "report",
            numbers={"query_ms": latest_ms},
        ),
        Row(
            "history queries use the history table's indexes (EXPLAIN)",
            "{index_scans}",
            "index scans",
            met(index_used),
            {"index_scans": "yes" if index_used else "no"},
        ),
    ]
