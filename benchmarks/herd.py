"""A thundering herd: every machine's crontab fires in the same second, against a capped role.

Machines are asyncio event loops in threads of one process, each with its own
connection (as separate hosts would have), racing one lock through a role whose
``CONNECTION LIMIT`` is far below their number.  Correctness is the measure
(exactly one start, no failures); the decision times and the server CPU per
machine are reported, the latter beside a floor: the same herd of machines that
each only connect (retrying refused connections as dislock does) and read one row
by its primary key, the least any lock decision costs the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg

from benchmarks.herd_pgbouncer import bench_pgbouncer, pgbouncer_available
from benchmarks.rows import Row, met
from benchmarks.server import backends_gone, server_cpu_reader

HERD_PASSWORD = "bench-herd"


@contextmanager
def capped_role(url: str, cap: int) -> Iterator[str]:
    """A role that may hold ``cap`` connections at once: the URL to use it."""
    from psycopg import sql as pgsql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    role = f"herd_{uuid.uuid4().hex[:8]}"
    name = pgsql.Identifier(role)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {} CONNECTION LIMIT {}").format(
                name, pgsql.Literal(HERD_PASSWORD), pgsql.Literal(cap)
            )
        )
        conn.execute(pgsql.SQL("GRANT SELECT, INSERT, UPDATE ON key_value TO {}").format(name))
    params = conninfo_to_dict(url)
    params.update(user=role, password=HERD_PASSWORD)
    try:
        yield make_conninfo("", **params)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
            )
            backends_gone(url, role, timeout=5.0)
            conn.execute(pgsql.SQL("DROP OWNED BY {}").format(name))
            conn.execute(pgsql.SQL("DROP ROLE {}").format(name))


def herd(url: str, strategy: str, machines: int) -> tuple[int, int, list[float], list[str]]:
    """``machines`` asyncio event loops in threads (each its own connection, as separate
    hosts would have) race one lock: starts, failures, seconds until each decided."""
    import threading

    import dislock.aio
    from dislock import LockContext, LockNotAcquiredError

    key = f"herd-{uuid.uuid4().hex[:8]}"
    go = threading.Event()
    everyone = threading.Barrier(machines)
    started_at = [0.0]
    decided: list[float] = []
    starts: list[int] = []
    failures: list[str] = []

    def wait_for_everyone() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            everyone.wait(120)

    async def machine(index: int) -> None:
        context = LockContext(
            url=url,
            table_parts=["key_value"],
            lock_key=key,
            owner=f"machine-{index}",
            schedule="0 0 1 1 *",
            run_ttl_seconds=60,
            lease_interval_seconds=10,
        )
        try:
            async with dislock.aio.acquire_locks(context, [strategy]):
                decided.append(time.perf_counter() - started_at[0])
                starts.append(index)
                # The lease is held until every machine has decided.
                await asyncio.to_thread(wait_for_everyone)
                return
        except LockNotAcquiredError:
            decided.append(time.perf_counter() - started_at[0])
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
        await asyncio.to_thread(wait_for_everyone)

    def run(index: int) -> None:
        go.wait()
        asyncio.run(machine(index))

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(machines)]
    for thread in threads:
        thread.start()
    started_at[0] = time.perf_counter()
    go.set()
    for thread in threads:
        thread.join(180)
    return len(starts), len(failures), decided, failures


def floor_herd(url: str, machines: int) -> int:
    """``machines`` event loops in threads that each connect (a refused connection
    retried after dislock's own backoff, ``ConnectPatience``) and read one row by its
    primary key, then close: how many failed."""
    import threading

    from dislock.core.patience import ConnectPatience

    go = threading.Event()
    failures: list[str] = []

    async def machine() -> None:
        patience = ConnectPatience(60.0, time.monotonic())
        while True:
            started = time.monotonic()
            try:
                conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
                break
            except psycopg.OperationalError as exc:
                delay = patience.next_delay(exc, time.monotonic(), attempt_started=started)
                if delay is None:
                    failures.append(str(exc))
                    return
                await asyncio.sleep(delay)
        async with conn:
            await conn.execute("SELECT value FROM key_value WHERE key = 'herd-floor'")

    def run() -> None:
        go.wait()
        asyncio.run(machine())

    threads = [threading.Thread(target=run, daemon=True) for _ in range(machines)]
    for thread in threads:
        thread.start()
    go.set()
    for thread in threads:
        thread.join(180)
    return len(failures)


HERD_SIZES = {True: ((50, 20),), False: ((200, 20), (1000, 50), (2000, 50))}
"""(machines, the role's connection limit) of the herds of a quick and a full run."""

BOUNCER_POOL = 20
"""Server connections of the PgBouncer in front of a herd (its ``default_pool_size``)."""


def herd_rows(url: str, sizes: Sequence[tuple[int, int]]) -> list[Row]:
    """Each herd of ``sizes`` racing one slot and one lease, straight to the server
    and, where PgBouncer is installed, through one in transaction pooling."""
    from psycopg.conninfo import conninfo_to_dict

    rows = []
    cpu = server_cpu_reader(url)
    for machines, cap in sizes:
        with capped_role(url, cap) as capped:
            role = str(conninfo_to_dict(capped)["user"])
            floor_ms: float | None = None
            if cpu is not None:
                backends_gone(url, role)
                floor_before = cpu()
                floor_failed = floor_herd(capped, machines)
                backends_gone(url, role)
                if not floor_failed:
                    floor_ms = (cpu() - floor_before) * 1000 / machines
            for strategy, what in (("schedule", "one slot"), ("lease", "one lease")):
                backends_gone(url, role)
                before = None if cpu is None else cpu()
                outcome = herd(capped, strategy, machines)
                backends_gone(url, role)
                spent = None if cpu is None or before is None else cpu() - before
                rows += _rows(
                    f"{machines} machines (own connection each) racing {what}, server capped"
                    f" at {cap} connections",
                    outcome,
                    "  server CPU per machine (the postmaster and the backends it reaped:"
                    " every connection, refused ones too)",
                    "n/a (the server is not local)" if spent is None else "{cpu_ms:.1f} ms",
                    {} if spent is None else {"cpu_ms": spent * 1000 / machines},
                )
                if spent is not None and floor_ms is not None:
                    ours = spent * 1000 / machines
                    rows.append(
                        Row(
                            "  the same / the floor: as many machines that only connect"
                            " (retried as dislock retries) and read one row by its key",
                            "{ratio:.2f} ({cpu_ms:.1f} ms / {floor_ms:.1f} ms)",
                            "≤ 1.2",
                            met(ours / floor_ms <= 1.2),
                            {"ratio": ours / floor_ms, "cpu_ms": ours, "floor_ms": floor_ms},
                        )
                    )
            if not pgbouncer_available():
                rows.append(
                    Row(f"{machines} machines through PgBouncer", "n/a (not installed)", "report")
                )
                continue
            for strategy, what in (("schedule", "one slot"), ("lease", "one lease")):
                backends_gone(url, role)
                before = None if cpu is None else cpu()
                with bench_pgbouncer(capped, pool=BOUNCER_POOL, clients=machines + 16) as bouncer:
                    outcome = herd(bouncer.url, strategy, machines)
                    pooler = bouncer.cpu()
                # (Stopped, PgBouncer closed its server connections: each was reaped.)
                backends_gone(url, role)
                spent = None if cpu is None or before is None else cpu() - before
                per = {"bouncer_ms": pooler * 1000 / machines}
                if spent is not None:
                    per["cpu_ms"] = spent * 1000 / machines
                    per["sum_ms"] = per["cpu_ms"] + per["bouncer_ms"]
                rows += _rows(
                    f"{machines} machines through PgBouncer (transaction pooling,"
                    f" {BOUNCER_POOL} server connections) racing {what}",
                    outcome,
                    "  CPU per machine: PostgreSQL + PgBouncer",
                    "{bouncer_ms:.2f} ms (PgBouncer; the server is not local)"
                    if spent is None
                    else "{sum_ms:.2f} ms ({cpu_ms:.2f} + {bouncer_ms:.2f})",
                    per,
                )
    return rows


def _rows(
    herd_of: str,
    outcome: tuple[int, int, list[float], list[str]],
    cpu_measure: str,
    cpu_template: str,
    cpu_numbers: dict[str, float],
) -> list[Row]:
    starts, failed, decided, failures = outcome
    times = sorted(decided)
    p50 = statistics.median(times) * 1000 if times else float("nan")
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))] * 1000 if times else 0.0
    return [
        Row(
            f"{herd_of}: starts",
            "{starts}",
            "exactly 1",
            met(starts == 1, "MISSED"),
            {"starts": starts},
        ),
        Row(
            "  failures",
            "{failures}{first}",
            "0",
            met(failed == 0, "MISSED"),
            {"failures": failed, "first": f" (first: {failures[0]})" if failures else ""},
        ),
        Row(
            "  time until a machine had its decision: p50 / p99 / all",
            "{p50_ms:.0f} ms / {p99_ms:.0f} ms / {all_ms:.0f} ms",
            "report",
            numbers={"p50_ms": p50, "p99_ms": p99, "all_ms": times[-1] * 1000 if times else 0},
        ),
        Row(cpu_measure, cpu_template, "report", numbers=cpu_numbers),
    ]
