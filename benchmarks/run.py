"""dislock's benchmarks: medians, and ratios measured side by side in the same run.

    hatch run bench            # every measure, several runs each (a few minutes)
    hatch run bench --quick    # one pass of everything, small sizes (CI's smoke test)

It starts its own embedded PostgreSQL (or uses ``BENCH_DATABASE_URL``), and
installs ``dislock==0.1.0`` from PyPI into a throwaway venv as the baseline a
user would otherwise pick (measured as a black box through its command line).
Machines here are noisy: absolute times are context, the ratios are the result.
Nothing here asserts a time.  The table and a plot go to ``docs/benchmarks.md``
and ``docs/benchmarks.png`` unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dislock.core.lock_statements import statements as lock_statements  # noqa: E402
from dislock.core.preparing import BACKEND_PID, prepare_threshold  # noqa: E402
from dislock.core.table import create_table_sql  # noqa: E402
from tests.support.postgres import postgres_url  # noqa: E402

FLOOR = "import os, psycopg; psycopg.connect(os.environ['DATABASE_URL']).execute('SELECT 1')"


@dataclass
class Row:
    measure: str
    value: str
    target: str
    verdict: str = ""
    samples: list[float] = field(default_factory=list)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def timed(command: list[str], env: dict[str, str], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        samples.append(time.perf_counter() - started)
    return samples


def interleaved(
    commands: dict[str, tuple[list[str], Callable[[], dict[str, str]]]], repeat: int
) -> dict[str, list[float]]:
    """Run each command once per round, rounds in turn, so drift hits all alike."""
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, (command, env) in commands.items():
            samples[name] += timed(command, env(), 1)
    return samples


@contextmanager
def old_dislock() -> Iterator[Path | None]:
    """``dislock==0.1.0`` in a throwaway venv: its ``dislock`` command, or None."""
    with tempfile.TemporaryDirectory(prefix="dislock-010-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        installed = subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--quiet", "dislock==0.1.0"],
            capture_output=True,
            text=True,
            check=False,
        )
        command = venv / "bin" / "dislock"
        yield command if installed.returncode == 0 and command.exists() else None


@contextmanager
def installed_dislock() -> Iterator[tuple[Path, str]]:
    """This checkout installed as users install it: wheels of ``dislock-cli`` and what it
    needs, built here and installed into a throwaway venv (what ``pipx`` does).  Its
    ``dislock`` command, and how it was installed.  An editable install is not what any
    user runs: each member adds a ``sys.path`` entry that every import searches.  Falls
    back to this environment's editable ``dislock`` where ``hatch`` cannot build."""
    from tools.release_check import build_into

    editable = Path(sys.executable).parent / "dislock"
    with tempfile.TemporaryDirectory(prefix="dislock-ours-") as tmp:
        wheels = Path(tmp) / "wheels"
        if build_into(wheels, ["wheel"], ["dislock-core", "dislock", "dislock-cli"]) is not None:
            yield editable, "editable install (hatch could not build wheels)"
            return
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        installed = subprocess.run(
            [
                str(venv / "bin" / "pip"),
                "install",
                "--quiet",
                "--find-links",
                str(wheels),
                "dislock-cli",
            ],
            capture_output=True,
            check=False,
        )
        command = venv / "bin" / "dislock"
        if installed.returncode == 0 and command.exists():
            yield command, "installed from wheels"
        else:
            yield editable, "editable install (the wheels did not install)"


def wrapper_env(url: str, strategy: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "LOCK_KEY": f"bench-{uuid.uuid4().hex[:10]}",  # a fresh lock: every run takes it
        "LOCK_STRATEGY": strategy,
        "CRON_SCHEDULE": "* * * * *",
        "RUN_LOCK_TTL_SECONDS": "60",
    }
    return env


def floor_environment(url: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": url}


def cli_rows(url: str, repeat: int) -> list[Row]:
    rows = []
    with old_dislock() as old, installed_dislock() as (command, how):
        ours = [str(command)]
        # The floor runs in the same venv as ours, so both start the same interpreter
        # with the same psycopg.
        floor_cmd = [str(command.parent / "python"), "-c", FLOOR]
        for strategy in ("lease", "schedule"):
            fresh_env = partial(wrapper_env, url, strategy)
            floor_env: Callable[[], dict[str, str]] = partial(floor_environment, url)
            commands: dict[str, tuple[list[str], Callable[[], dict[str, str]]]] = {
                "floor": (floor_cmd, floor_env),
                "ours": ([*ours, "DATABASE_URL", "true"], fresh_env),
            }
            if old is not None:
                commands["old"] = ([str(old), "DATABASE_URL", "true"], fresh_env)
            samples = interleaved(commands, repeat)
            floor, mine = median_ms(samples["floor"]), median_ms(samples["ours"])
            rows.append(
                Row(
                    f"CLI `dislock URL true`, {strategy}: ours ({how}) / floor",
                    f"{mine / floor:.2f} ({mine:.0f} ms / {floor:.0f} ms)",
                    "≤ 1.05",
                    "met" if mine / floor <= 1.05 else "missed",
                    samples["ours"],
                )
            )
            if "old" in samples:
                theirs = median_ms(samples["old"])
                rows.append(
                    Row(
                        f"CLI, {strategy}: ours / dislock 0.1.0",
                        f"{mine / theirs:.2f} (0.1.0: {theirs / floor:.2f} x floor)",
                        "≤ 0.95",
                        "met" if mine / theirs <= 0.95 else "missed",
                    )
                )
            else:
                rows.append(
                    Row(
                        f"CLI, {strategy}: ours / dislock 0.1.0",
                        "n/a",
                        "≤ 0.95",
                        "dislock 0.1.0 could not be installed",
                    )
                )
    return rows


IMPORT_COST = (
    "import time; import psycopg; started = time.perf_counter(); import {module};"
    " print(time.perf_counter() - started)"
)


def import_rows(repeat: int) -> list[Row]:
    """What importing dislock adds to a process that has psycopg already, measured
    inside fresh interpreters (a difference of two process timings is all noise)."""
    rows = []
    for module in ("dislock", "dislock.cli"):
        code = IMPORT_COST.format(module=module)
        samples = [
            float(
                subprocess.run(
                    [sys.executable, "-c", code], capture_output=True, text=True, check=True
                ).stdout
            )
            for _ in range(repeat)
        ]
        extra = median_ms(samples)
        rows.append(
            Row(
                f"`import {module}` beyond `import psycopg`",
                f"{extra:.1f} ms",
                "≤ 15 ms",
                "met" if extra <= 15 else "missed",
            )
        )
    return rows


def commits(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    time.sleep(0.6)  # backends flush their statistics when they exit
    row = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


def cycle_context(url: str, table: str = "key_value") -> Any:
    from dislock import LockContext

    return LockContext(
        url=url,
        table_parts=table.split("."),
        lock_key="bench-cycle",
        owner=f"bench:{os.getpid()}",
        run_ttl_seconds=60.0,
        lease_interval_seconds=10.0,
    )


def sync_cycles(url: str, cycles: int, table: str = "key_value") -> float:
    """Seconds per acquire + release of a sync lease on a warm connection."""
    from dislock import LeaseLock, keep_connected

    context = cycle_context(url, table)
    with keep_connected(url):
        with LeaseLock(context):  # the first cycle warms psycopg's caches too
            pass
        started = time.perf_counter()
        for _ in range(cycles):
            with LeaseLock(context):
                pass
        return (time.perf_counter() - started) / cycles


def aio_cycles(url: str, cycles: int) -> float:
    """The same with the asyncio API."""
    import dislock.aio

    context = cycle_context(url)

    async def run() -> float:
        async with dislock.aio.keep_connected(url):
            async with dislock.aio.LeaseLock(context):
                pass
            started = time.perf_counter()
            for _ in range(cycles):
                async with dislock.aio.LeaseLock(context):
                    pass
            return (time.perf_counter() - started) / cycles

    return asyncio.run(run())


ROUNDS = 7


def cycle_rows(url: str, cycles: int) -> list[Row]:
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as warm:
        warm.execute("CREATE TABLE IF NOT EXISTS bench_write (k text PRIMARY KEY, t timestamptz)")
        warm.execute("INSERT INTO bench_write VALUES ('k', NOW()) ON CONFLICT DO NOTHING")
        # A session counts as one transaction in pg_stat_database by itself.
        before = commits(warm)
        for _ in range(cycles):
            psycopg.connect(url).close()
        per_connection = (commits(warm) - before - 1) / cycles

        def two(statement: str) -> float:
            started = time.perf_counter()
            for _ in range(cycles):
                warm.execute(statement)
                warm.execute(statement)
            return (time.perf_counter() - started) / cycles

        before = commits(warm)
        sync_cycles(url, cycles)
        # Counted once the shared connection has closed (a backend reports its
        # statistics when it exits): minus reading the counter, the session and
        # the warm-up cycle.
        per_cycle = (commits(warm) - before - 1 - per_connection - 2) / cycles

        # Timed in interleaved rounds, medians kept, so that drift on a noisy
        # machine hits every measure alike.
        statements = lock_statements(("key_value",))
        queries = statements.queries
        acquire, release = queries.acquire_for.as_bytes(warm), queries.release.as_bytes(warm)
        key = "cronjob-lock:lease:bench-by-hand"
        acquire_params = statements.acquire_for(key, "bench", 60.0).params
        release_params = statements.release(key, "bench", "bench-by-hand").params
        # Prepared as dislock's shared connection prepares them: only when no
        # pooler is in between (dislock.core.preparing).
        manual = psycopg.connect(url, autocommit=True, prepare_threshold=None)
        pid = manual.execute(BACKEND_PID).fetchone()
        manual.prepare_threshold = prepare_threshold(manual.info.backend_pid, pid and pid[0])

        def by_hand() -> float:
            """The same two statements, sent with psycopg and nothing else."""
            started = time.perf_counter()
            for _ in range(cycles):
                manual.execute(acquire, acquire_params).fetchone()
                manual.execute(release, release_params)
            return (time.perf_counter() - started) / cycles

        rounds: dict[str, list[float]] = {
            "reads": [],
            "writes": [],
            "by hand": [],
            "sync": [],
            "aio": [],
        }
        for _ in range(ROUNDS):
            rounds["reads"].append(two("SELECT 1"))
            # Every lock statement is a write, and a committed write waits for
            # the WAL to reach the disk: the floor a durable lock can reach.
            rounds["writes"].append(two("UPDATE bench_write SET t = NOW() WHERE k = 'k'"))
            rounds["by hand"].append(by_hand())
            rounds["sync"].append(sync_cycles(url, cycles))
            rounds["aio"].append(aio_cycles(url, cycles))
        manual.close()
        reads, writes, hand, ours, ours_aio = (statistics.median(rounds[k]) for k in rounds)
    return [
        Row(
            "acquire + release on a warm connection (`keep_connected`), sync:"
            " per cycle / two `SELECT 1` round trips",
            f"{ours / reads:.2f} ({ours * 1000:.3f} ms / {reads * 1000:.3f} ms)",
            "≤ 1.3",
            "met"
            if ours / reads <= 1.3
            else "missed: a lock statement is a write, and its commit waits for the WAL flush",
        ),
        Row(
            "  same, per cycle / two single-row `UPDATE` round trips (durable commits)",
            f"{ours / writes:.2f} ({writes * 1000:.3f} ms)",
            "≤ 1.3",
            "met" if ours / writes <= 1.3 else "missed",
        ),
        Row(
            "  same, per cycle / the same two statements sent by hand with psycopg"
            " (what dislock itself adds)",
            f"{ours / hand:.2f} ({hand * 1000:.3f} ms)",
            "report",
        ),
        Row(
            "  same with asyncio, per cycle / two single-row `UPDATE` round trips",
            f"{ours_aio / writes:.2f} ({ours_aio * 1000:.3f} ms)",
            "≤ 1.3",
            "met" if ours_aio / writes <= 1.3 else "missed",
        ),
        Row(
            "statements per acquire + release (pg_stat_database)",
            f"{per_cycle:.1f}",
            "2",
            "met" if round(per_cycle) <= 2 else "missed",
        ),
    ]


def race_rows(url: str, processes: int) -> list[Row]:
    ours = str(Path(sys.executable).parent / "dislock")
    with tempfile.TemporaryDirectory() as tmp:
        starts = Path(tmp) / "starts"
        env = {**wrapper_env(url, "schedule"), "CRON_SCHEDULE": "0 0 1 1 *"}
        command = [ours, "DATABASE_URL", "sh", "-c", f'echo started >> "{starts}"']
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
            str(count),
            "exactly 1",
            "met" if count == 1 else "MISSED",
        ),
        Row(
            "  time until every racer had its decision", f"{max(durations) * 1000:.0f} ms", "report"
        ),
        Row(
            "  WAL the whole race wrote (the winner's row and the lock-delay bookkeeping:"
            " a refused racer writes none)",
            f"{wal_bytes:,} bytes",
            "report",
        ),
    ]


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
            _backends_gone(url, role, timeout=5.0)
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


def _backends_gone(url: str, role: str, timeout: float = 30.0) -> None:
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


def herd_rows(url: str, machines: int, cap: int) -> list[Row]:
    from psycopg.conninfo import conninfo_to_dict

    rows = []
    cpu = server_cpu_reader(url)
    with capped_role(url, cap) as capped:
        role = str(conninfo_to_dict(capped)["user"])
        for strategy, what in (("schedule", "one slot"), ("lease", "one lease")):
            _backends_gone(url, role)
            cpu_before = None if cpu is None else cpu()
            starts, failed, decided, failures = herd(capped, strategy, machines)
            _backends_gone(url, role)
            spent = None if cpu is None or cpu_before is None else cpu() - cpu_before
            times = sorted(decided)
            p50 = statistics.median(times) * 1000 if times else float("nan")
            p99 = times[min(len(times) - 1, int(len(times) * 0.99))] * 1000 if times else 0.0
            rows += [
                Row(
                    f"{machines} machines (own connection each) racing {what}, server capped at"
                    f" {cap} connections: starts",
                    str(starts),
                    "exactly 1",
                    "met" if starts == 1 else "MISSED",
                ),
                Row(
                    "  failures",
                    str(failed) + (f" (first: {failures[0]})" if failures else ""),
                    "0",
                    "met" if failed == 0 else "MISSED",
                ),
                Row(
                    "  time until a machine had its decision: p50 / p99 / all",
                    f"{p50:.0f} ms / {p99:.0f} ms / {times[-1] * 1000 if times else 0:.0f} ms",
                    "report",
                ),
                Row(
                    "  server CPU per machine (the postmaster and the backends it reaped:"
                    " every connection, refused ones too)",
                    "n/a (the server is not local)"
                    if spent is None
                    else f"{spent * 1000 / machines:.1f} ms",
                    "report",
                ),
            ]
    return rows


@contextmanager
def granted_tables(url: str) -> Iterator[str]:
    """One login role with a lock table of each kind: ``bench_plain.key_value`` on the
    broad grant (no row-level security), ``bench_secured.key_value`` through
    ``dislockctl grant --keys 'bench-*'``.  Yields the role's URL."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from dislock.core.grants import WRAPPER, grant_statements

    role = "bench_wrapper"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("DROP SCHEMA IF EXISTS bench_plain, bench_secured CASCADE")
        if admin.execute("SELECT FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
            admin.execute(f"CREATE ROLE {role} LOGIN")
        for schema in ("bench_plain", "bench_secured"):
            admin.execute(f"CREATE SCHEMA {schema}")
            admin.execute(create_table_sql((schema, "key_value")))
            admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        admin.execute(f"GRANT SELECT, INSERT, UPDATE ON bench_plain.key_value TO {role}")
        with admin.transaction():
            for statement in grant_statements(
                ("bench_secured", "key_value"),
                role,
                WRAPPER,
                ["bench-*"],
                max_ttl=3600,
                fencing=False,
                history=None,
            ):
                admin.execute(statement)
    params = conninfo_to_dict(url)
    params["user"] = role
    try:
        yield make_conninfo("", **params)
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("DROP SCHEMA bench_plain, bench_secured CASCADE")
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


def roles_rows(url: str, repeat: int, cycles: int) -> list[Row]:
    """What a grant costs: the same role, start-up and warm cycles, on a table with
    and without row-level security."""
    rows = []
    with granted_tables(url) as role_url, installed_dislock() as (command, how):
        tables = {"plain": "bench_plain.key_value", "secured": "bench_secured.key_value"}

        def env(table: str) -> Callable[[], dict[str, str]]:
            return lambda: {**wrapper_env(role_url, "lease"), "LOCK_TABLE": table}

        samples = interleaved(
            {name: ([str(command), "DATABASE_URL", "true"], env(t)) for name, t in tables.items()},
            repeat,
        )
        plain, secured = median_ms(samples["plain"]), median_ms(samples["secured"])
        rows.append(
            Row(
                f"CLI `dislock URL true`, lease, as a granted role ({how}): with / without grants",
                f"{secured / plain:.2f} ({secured:.0f} ms / {plain:.0f} ms)",
                "≤ 1.05",
                "met" if secured / plain <= 1.05 else "missed",
            )
        )
        rounds: dict[str, list[float]] = {"plain": [], "secured": []}
        for _ in range(ROUNDS):
            for name, table in tables.items():
                rounds[name].append(sync_cycles(role_url, cycles, table))
        plain, secured = median_ms(rounds["plain"]), median_ms(rounds["secured"])
        rows.append(
            Row(
                "warm sync lease cycle, as a granted role: with / without grants",
                f"{secured / plain:.2f} ({secured:.2f} ms / {plain:.2f} ms)",
                "≤ 1.10",
                "met" if secured / plain <= 1.10 else "missed",
            )
        )
    return rows


def percentile_ms(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))] * 1000


def waiter_context(url: str, lock_key: str, owner: str, **extra: Any) -> Any:
    from dislock import LockContext

    return LockContext(
        url=url,
        table_parts=["key_value"],
        lock_key=lock_key,
        owner=owner,
        run_ttl_seconds=30.0,
        lease_interval_seconds=5.0,
        **extra,
    )


def handover_samples(url: str, trials: int, extra_env: dict[str, str]) -> list[float]:
    """Seconds from the holder's release to the start of the waiting wrapper's command."""
    from dislock import LeaseLock

    ours = str(Path(sys.executable).parent / "dislock")
    samples = []
    for _ in range(trials):
        env = {
            **wrapper_env(url, "lease"),
            "LOCK_WAIT_SECONDS": "30",
            "CRONJOB_LOCK_LOG_LEVEL": "INFO",
            **extra_env,
        }
        holder = LeaseLock(waiter_context(url, env["LOCK_KEY"], "bench-holder"))
        holder.__enter__()
        waiter = subprocess.Popen(
            [ours, "DATABASE_URL", "date", "+%s.%N"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert waiter.stderr is not None
        while "waiting up to" not in waiter.stderr.readline():
            pass
        time.sleep(0.2)  # well into the wait
        released = time.time()
        holder.__exit__(None, None, None)
        stdout, _ = waiter.communicate(timeout=60)
        samples.append(float(stdout.strip()) - released)
    return samples


def waiters_spread(
    url: str, waiters: int, hold: float, slots: int = 1
) -> tuple[list[float], float]:
    """``waiters`` threads asking at once for one lease (or ``slots`` slots of it), each
    holding it ``hold`` seconds: how long each waited, and the time until all were done."""
    import threading

    from dislock import LeaseLock

    lock_key = f"bench-{uuid.uuid4().hex[:10]}"
    waited: list[float] = []
    start = time.monotonic() + 1.0

    def waiter(n: int) -> None:
        context = waiter_context(url, lock_key, f"waiter-{n}", wait_seconds=60.0, slots=slots)
        time.sleep(max(0.0, start - time.monotonic()))
        asked = time.monotonic()
        with LeaseLock(context):
            waited.append(time.monotonic() - asked)
            time.sleep(hold)

    threads = [threading.Thread(target=waiter, args=(n,)) for n in range(waiters)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return waited, time.monotonic() - start


def release_notify_cost(url: str, cycles: int) -> tuple[float, float]:
    """Seconds per lease release statement on a warm connection, without and with the
    ``NOTIFY`` that wakes waiters (what every release now sends)."""
    statements = lock_statements(("key_value",))
    # The release as it was before it woke waiters: the same update, no RETURNING.
    plain = psycopg.sql.SQL(
        "UPDATE key_value SET expire_at = NOW(), value = value || ' (released)'"
        " WHERE key = %(key)s AND value = %(owner)s AND expire_at > NOW()"
    )
    variants: tuple[psycopg.sql.SQL | psycopg.sql.Composed, ...] = (
        plain,
        statements.queries.release,
    )
    params = statements.release("bench-release", "bench", "bench-release").params
    totals = [0.0, 0.0]
    acquire = statements.acquire_for("bench-release", "bench", 60.0)
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        for cycle in range(cycles + 10):
            for index, release in enumerate(variants):  # interleaved: same noise
                conn.execute(acquire.query, acquire.params)
                started = time.perf_counter()
                conn.execute(release, params)
                if cycle >= 10:  # the first ones warm the caches
                    totals[index] += time.perf_counter() - started
    return totals[0] / cycles, totals[1] / cycles


def waiting_rows(url: str, trials: int) -> list[Row]:
    notify = handover_samples(url, trials, {})
    poll = handover_samples(url, trials, {"LOCK_WAIT_LISTEN": "0", "LOCK_WAIT_POLL_SECONDS": "0.5"})
    waited, total = waiters_spread(url, 20, 0.1)
    slot_waits, slot_total = waiters_spread(url, 50, 0.1, slots=5)
    plain, notifying = release_notify_cost(url, max(trials * 10, 50))
    p50 = percentile_ms(notify, 0.5)
    return [
        Row(
            f"hand-over, release to the waiting wrapper's command start, LISTEN/NOTIFY: p50 / p99"
            f" ({len(notify)} trials)",
            f"{p50:.1f} ms / {percentile_ms(notify, 0.99):.1f} ms",
            "p50 ≤ 20 ms",
            "met" if p50 <= 20 else "missed",
        ),
        Row(
            "  same, polling only every 0.5 s ± 50 % (what a waiter behind PgBouncer does):"
            f" p50 / p99 ({len(poll)} trials)",
            f"{percentile_ms(poll, 0.5):.0f} ms / {percentile_ms(poll, 0.99):.0f} ms",
            "report, against the poll interval (0.5 s ± 50 %)",
        ),
        Row(
            "20 waiters on one lease, each holding it 100 ms: waits min / p50 / max",
            f"{min(waited) * 1000:.0f} / {percentile_ms(waited, 0.5):.0f} /"
            f" {max(waited) * 1000:.0f} ms ({len(waited)} of 20 ran)",
            "all run within their wait (60 s)",
            "met" if len(waited) == 20 and max(waited) <= 60 else "MISSED",
        ),
        Row(
            "  time until all 20 were done / 20 x 100 ms of work",
            f"{total:.2f} s / 2.00 s",
            "report",
        ),
        Row(
            "5 slots, 50 contenders holding 100 ms each: time until all done / 50 x 100 ms / 5",
            f"{slot_total:.2f} s / 1.00 s ({len(slot_waits)} of 50 ran,"
            f" max wait {max(slot_waits) * 1000:.0f} ms)",
            "report",
        ),
        Row(
            "lease release statement on a warm connection: with NOTIFY / without",
            f"{notifying / plain:.2f} ({notifying * 1000:.3f} ms / {plain * 1000:.3f} ms)",
            "report",
        ),
    ]


class RenewalTimes:
    """Collects how long each batched renewal took, told by the renewer itself."""

    def __init__(self) -> None:
        self.milliseconds: list[float] = []

    def __call__(self, keys: Sequence[str], seconds: float) -> None:
        self.milliseconds.append(seconds * 1000)


@asynccontextmanager
async def many_leases(
    url: str, table: str, leases: int, ttl: float, interval: float
) -> AsyncIterator[RenewalTimes]:
    """``leases`` asyncio leases held at once in this process."""
    import dislock.aio
    from dislock import LockContext
    from dislock.core.renewal import renewal_listeners

    times = RenewalTimes()
    renewal_listeners.append(times)
    locks = [
        dislock.aio.LeaseLock(
            LockContext(
                url=url,
                table_parts=[table],
                lock_key=f"{table}-{n}",
                owner=f"bench:{n}",
                run_ttl_seconds=ttl,
                lease_interval_seconds=interval,
            )
        )
        for n in range(leases)
    ]
    try:
        async with AsyncExitStack() as stack:
            for lock in locks:
                await stack.enter_async_context(lock)
            yield times
    finally:
        renewal_listeners.remove(times)


def server_connections(url: str) -> tuple[int, int]:
    """Connections dislock has open on the server, and the server's limit."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE application_name = 'dislock'),"
            " current_setting('max_connections')::int FROM pg_stat_activity"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def lease_scale_rows(url: str, leases: int) -> list[Row]:
    async def connections_used() -> tuple[int, int]:
        async with many_leases(url, "key_value", leases, ttl=30.0, interval=5.0):
            return server_connections(url)

    used, limit = asyncio.run(connections_used())
    return [
        Row(
            f"{leases} concurrent leases in one asyncio process (server max_connections"
            f" = {limit}): server connections",
            f"{used}",
            "≤ 10",
            "met" if used <= 10 else "missed",
        ),
    ]


def hot_rows(url: str, leases: int, seconds: float) -> list[Row]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS hot_locks")
        conn.execute(create_table_sql(("hot_locks",)))
        conn.execute("SELECT pg_stat_reset()")

        def size() -> int:
            row = conn.execute("SELECT pg_relation_size('hot_locks')").fetchone()
            assert row is not None
            return int(row[0])

        sizes: list[int] = []

        async def renew_for_a_while() -> list[float]:
            async with many_leases(url, "hot_locks", leases, ttl=3.0, interval=1.0) as times:
                first = min(60.0, seconds / 2)
                await asyncio.sleep(first)
                sizes.append(size())
                await asyncio.sleep(seconds - first)
                sizes.append(size())
                return times.milliseconds

        renewal_ms = asyncio.run(renew_for_a_while())
        time.sleep(0.6)
        stats = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd, c.reloptions"
            " FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
            " WHERE s.relname = 'hot_locks'"
        ).fetchone()
        indexed = conn.execute(
            "SELECT count(*) FROM pg_index i JOIN pg_attribute a"
            " ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
            " WHERE i.indrelid = 'hot_locks'::regclass AND a.attname = 'expire_at'"
        ).fetchone()
    assert stats is not None and indexed is not None
    updates, hot, options = int(stats[0]), int(stats[1]), stats[2] or []
    share = hot / updates if updates else 0.0
    p99 = statistics.quantiles(renewal_ms, n=100)[98] if len(renewal_ms) >= 2 else float("nan")
    first_label = f"after {min(60.0, seconds / 2):.0f} s"
    return [
        Row(
            f"{leases} leases renewed every second for {seconds:.0f} s: HOT updates",
            f"{share:.0%} of {updates}",
            "≥ 95 %",
            "met" if share >= 0.95 else "missed",
        ),
        Row(
            "  table size",
            f"{sizes[0] // 1024} KiB {first_label}, {sizes[1] // 1024} KiB at the end",
            "flat after the first minute",
            "met" if sizes[1] <= sizes[0] else "missed",
        ),
        Row(
            f"  renewal statement ({leases} leases each): p50 / p99",
            f"{statistics.median(renewal_ms):.1f} ms / {p99:.1f} ms over {len(renewal_ms)}",
            "report",
        ),
        Row(
            "  table settings that keep renewals HOT",
            f"{', '.join(options) or 'defaults'}; indexes on expire_at: {indexed[0]}",
            "fillfactor < 100, no index on expire_at",
            "met" if options and not indexed[0] else "missed",
        ),
    ]


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
    import re
    import urllib.request

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
            f"{median_ms(steady):.0f} ms / {p95 * 1000:.0f} ms",
            "< 250 ms",
            "met" if p95 < 0.25 else "missed",
        ),
        Row(
            "  first scrape after start (counts the history once)",
            f"{first * 1000:.0f} ms",
            "report",
        ),
        Row("  status page `/`, all keys", f"{median_ms(page):.0f} ms (median)", "report"),
    ]


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
    import dataclasses

    return {f.name: getattr(context, f.name) for f in dataclasses.fields(context) if f.init}


HISTORY_ROWS = 1_000_000
HISTORY_KEYS = 1_000


def history_rows(url: str, cycles: int, rows: int) -> list[Row]:
    """What recording costs a run, and how fast `history`/`missed` answer on a big table."""
    from dislock.cli import missed_slots, run_history
    from dislock.core.history import create_history

    history = ("key_value_history",)
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        conn.execute("DROP TABLE IF EXISTS key_value_history")
        for statement in create_history(history):
            conn.execute(statement)
        off_samples, on_samples = history_cycles(url, cycles * ROUNDS)
        off, on = statistics.median(off_samples), statistics.median(on_samples)
        # The CLI, end to end: LOCK_HISTORY=1 against 0, interleaved.
        ours = [str(Path(sys.executable).parent / "dislock")]

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
            max(cycles // 10, 3),
        )
        cli_off, cli_on = median_ms(cli["off"]), median_ms(cli["on"])

        # The pause check rides in the acquiring statement: the upsert as it was
        # before pauses, against today's, sent by hand (acquire + release).
        plain = (
            b"INSERT INTO key_value AS held (key, value, expire_at)"
            b" VALUES (%(key)s, %(owner)s, NOW() + make_interval(secs => %(ttl)s))"
            b" ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value,"
            b" expire_at = EXCLUDED.expire_at WHERE held.expire_at <= NOW() RETURNING NULL::bigint"
        )
        statements = lock_statements(("key_value",))
        queries = statements.queries
        checked, release = queries.acquire_for.as_bytes(conn), queries.release.as_bytes(conn)
        key = "cronjob-lock:lease:bench-pause"
        acquire_params = statements.acquire_for(key, "bench", 60.0).params
        release_params = statements.release(key, "bench", "bench-pause").params

        pause_samples: tuple[list[float], list[float]] = ([], [])
        for n in range(cycles * ROUNDS):
            for which in (0, 1) if n % 2 else (1, 0):
                started = time.perf_counter()
                conn.execute((plain, checked)[which], acquire_params)
                conn.execute(release, release_params)
                pause_samples[which].append(time.perf_counter() - started)
        without_check, with_check = (statistics.median(samples) for samples in pause_samples)

        # A big history: HISTORY_KEYS keys, hourly runs going back as far as
        # `rows` needs, every tenth run of each key failed.
        conn.execute("TRUNCATE key_value_history")
        conn.execute(
            "INSERT INTO key_value_history (lock_key, modes, slot_end, owner, host, pid,"
            " started_at, ended_at, outcome, exit_code, cron)"
            " SELECT 'job-' || (n %% %(keys)s), 'schedule',"
            " date_trunc('hour', NOW()) - make_interval(hours => n / %(keys)s) + interval '1 hour',"
            " 'host:1:ab', 'host-' || (n %% 50), n,"
            " date_trunc('hour', NOW()) - make_interval(hours => n / %(keys)s),"
            " date_trunc('hour', NOW()) - make_interval(hours => n / %(keys)s) + interval '2 s',"
            " CASE WHEN (n / %(keys)s) %% 10 = 0 THEN 'failed' ELSE 'ok' END,"
            " CASE WHEN (n / %(keys)s) %% 10 = 0 THEN 1 ELSE 0 END, '0 * * * *'"
            " FROM generate_series(0, %(rows)s - 1) AS n",
            {"keys": HISTORY_KEYS, "rows": rows},
        )
        conn.execute("VACUUM ANALYZE key_value_history")
        locks = ("key_value",)

        def query_ms(run: Callable[[], object]) -> float:
            run()  # warm the cache
            samples = []
            for _ in range(9):
                started = time.perf_counter()
                run()
                samples.append(time.perf_counter() - started)
            return median_ms(samples)

        by_key = run_history.runs_query(history, locks, by_key=True)
        every = run_history.runs_query(history, locks, by_key=False)
        day = run_history.runs_params("job-7", timedelta_hours(24), 100)
        key_ms = query_ms(lambda: conn.execute(by_key, day).fetchall())
        all_ms = query_ms(
            lambda: conn.execute(
                every, run_history.runs_params(None, timedelta_hours(24), 100)
            ).fetchall()
        )

        def missed() -> object:
            (now,) = conn.execute("SELECT NOW()").fetchone()  # type: ignore[misc]
            since = now - timedelta_hours(24)
            starts = conn.execute(
                missed_slots.starts_query(history), {"key": "job-7", "since": since}
            ).fetchall()
            slots = list(missed_slots.schedule_slots("0 * * * *", since, now))
            return missed_slots.missed_slots(
                slots, [(s, e) for _, s, e, _ in starts if s is not None]
            )

        missed_ms = query_ms(missed)
        # Per key: newest run and newest success (what an exporter reads per scrape).
        conn.execute(
            "INSERT INTO key_value SELECT 'cronjob-lock:schedule:job-' || n, 'host:1:ab',"
            " NOW() + interval '1 hour' FROM generate_series(0, %s - 1) AS n"
            " ON CONFLICT DO NOTHING",
            (HISTORY_KEYS,),
        )
        latest = run_history.latest_query(history, locks)
        latest_ms = query_ms(lambda: conn.execute(latest).fetchall())
        conn.execute("DELETE FROM key_value WHERE key LIKE 'cronjob-lock:schedule:job-%'")
        plans = {
            "history KEY": conn.execute(b"EXPLAIN " + by_key.as_bytes(conn), day).fetchall(),
            "history": conn.execute(
                b"EXPLAIN " + every.as_bytes(conn),
                run_history.runs_params(None, timedelta_hours(24), 100),
            ).fetchall(),
        }
        for name, plan in plans.items():
            print(f"EXPLAIN {name}:\n" + "\n".join(str(line[0]) for line in plan), file=sys.stderr)
        conn.execute("DROP TABLE key_value_history")
    index_used = all("key_value_history_" in str(plan) for plan in plans.values())
    return [
        Row(
            "run history on: added time per run, `acquire_locks` lease run on a warm connection"
            " (one INSERT as it starts, one UPDATE as it ends)",
            f"{(on - off) * 1000:.3f} ms ({on * 1000:.3f} ms / {off * 1000:.3f} ms)",
            "≤ 1 ms",
            "met" if on - off <= 0.001 else "missed",
        ),
        Row(
            "  same through the CLI, `LOCK_HISTORY=1` against `0` (medians of whole runs)",
            f"{cli_on - cli_off:.1f} ms ({cli_on:.0f} ms / {cli_off:.0f} ms)",
            "report",
        ),
        Row(
            "pause check folded into the acquisition: acquire + release by hand, today's upsert"
            " / the upsert without the check",
            f"{with_check / without_check:.2f} ({with_check * 1000:.3f} ms"
            f" / {without_check * 1000:.3f} ms)",
            "report (no extra round trip)",
        ),
        Row(
            f"`history KEY` (24 h, 100 runs) with {rows:,} history rows",
            f"{key_ms:.1f} ms",
            "< 200 ms",
            "met" if key_ms < 200 else "missed",
        ),
        Row(
            f"`history` (every key, 24 h, newest 100) with {rows:,} rows",
            f"{all_ms:.1f} ms",
            "< 200 ms",
            "met" if all_ms < 200 else "missed",
        ),
        Row(
            f"`missed KEY` (hourly, 24 h) with {rows:,} rows",
            f"{missed_ms:.1f} ms",
            "< 200 ms",
            "met" if missed_ms < 200 else "missed",
        ),
        Row(
            f"newest run and newest success of each of {HISTORY_KEYS:,} keys"
            f" (`dislock.cli.run_history.latest_query`) with {rows:,} rows",
            f"{latest_ms:.1f} ms",
            "report",
        ),
        Row(
            "history queries use the history table's indexes (EXPLAIN)",
            "yes" if index_used else "no",
            "index scans",
            "met" if index_used else "missed",
        ),
    ]


def timedelta_hours(hours: float) -> Any:
    from datetime import timedelta

    return timedelta(hours=hours)


READING = """## Reading the results

- **Waiting.** The hand-over is timed from just before the holder's release to the moment the
  waiting wrapper's command (`date +%s.%N`) runs: the release's `NOTIFY`, the waiter's wake-up
  and upsert, and starting the command. With polling it is dominated by the time to the next
  poll, on average a little over half the 0.5 s poll interval (the jitter spreads polls over
  0.25 to 0.75 s). The 20 waiters and the 50 slot contenders are threads of one process, started
  together; the time until all are done, against the work they did, is the hand-over overhead.
- **The CLI against the floor.** The floor starts Python, imports psycopg, connects, runs
  `SELECT 1` and exits; the wrapper does that too, then takes the lock, *starts the command*,
  waits for it and releases. Both, and dislock 0.1.0, are installed from wheels into fresh
  venvs, as `pipx` installs them (an editable install adds a `sys.path` entry per member that
  every import searches). Three things make the wrapper cheaper than it looks: a schedule slot
  is picked by the database clock inside the acquiring statement (no round trip to read the
  clock); the command and its guard (a `/bin/sh` outside the command's process group that kills
  the whole group if the wrapper dies) are started with `vfork`, since neither runs Python in
  the forked child; and once the locks are released and the connection closed, the process
  ends without the interpreter's teardown (`dislock.cli._exit`), which costs any process that
  imported psycopg about 18 ms: the floor and 0.1.0 pay it, so the wrapper can beat the
  floor. dislock's own imports add about 3 ms beyond psycopg; a schedule run also imports
  croniter (about 6 ms), as 0.1.0 does on every run.
- **The herd.** Every machine's crontab fires in the same second; here 200 asyncio event loops
  in one process (each its own connection, as separate hosts would have) race one lock through a
  role whose `CONNECTION LIMIT` is 20. Refused connections are retried with jittered exponential
  backoff (`connect_patience_seconds`), so no machine fails; with the patience set to 0, most of
  them fail with `too many connections for role`.
- **Warm cycles.** Taking and releasing a lock are two writes, and PostgreSQL commits a write
  only once its WAL is on disk, so two `SELECT 1` are not a floor any lock can reach; two
  single-row `UPDATE`s are. Sending the very same two statements by hand with psycopg (prepared
  as dislock prepares them) shows what dislock adds on top of the statements themselves. The
  acquiring statement is heavier than an `UPDATE`: it reads the key's pause row and the
  failover lock-delay rows in the same round trip. Unprepared, PostgreSQL parses and plans it
  anew on every execution (`EXPLAIN ANALYZE`: 0.17 ms of planning for 0.07 ms of execution,
  and parsing it costs about as much again): sent by hand, its round trip took 0.68 ms, against
  0.22 ms prepared. So a shared connection that has served eight statements (more than a
  one-shot wrapper run sends) checks once whether it reaches the server directly (a pooler
  answers the startup with a backend process id of its own making, unlike `pg_backend_pid()`)
  and only then lets psycopg prepare the statements it repeats; after PostgreSQL's first five
  custom plans the upsert runs a cached generic plan. What is left against the `UPDATE`s is the
  prepared upsert's own work (its lock-delay and pause reads, two conditional inserts that
  write nothing), the connection's first dozen cycles, which each round of the measure pays
  again on a new connection, and dislock's own bookkeeping. Behind PgBouncer nothing is
  prepared, and a warm cycle still pays the parsing and planning (about 0.45 ms of the
  acquisition).
- **`dislockctl serve`.** A scrape reads each key's latest run and latest success through the
  history's `(lock_key, started_at)` index (a few probes per key, whatever the history's
  length), and of the rest only the runs that are new since the previous scrape: run counts and
  the missed-slot window are kept in the server, so only its first scrape reads the whole
  history (and enumerates each schedule's slots of the last 24 hours). `prometheus_client`
  renders the exposition in chunks of 100 samples, each again only when its samples changed.
- **Run history.** A run with `LOCK_HISTORY=1` sends two more statements (an `INSERT` as it
  starts, an `UPDATE` as it ends), each committing asynchronously (`synchronous_commit` off for
  its own transaction), so it pays two round trips and no WAL flush. The CLI comparison times
  whole processes: differences of a few milliseconds either way are noise there. `history` and
  `missed` read the `(lock_key, started_at DESC)` index (`history` without a key the
  `(started_at)` one, backwards): `Index Scan using key_value_history_key_started … Index Cond:
  ((lock_key = 'job-7') AND (started_at >= (now() - '24:00:00')))`, then `Limit`; the lock table is
  read only for runs without an end (running or abandoned?).
- **Pause check.** The acquiring statement reads the key's pause row in a CTE (a primary-key
  lookup) and answers in the same round trip; the row compares it with the same upsert without
  the check, sent by hand.
- **Scale.** Every lease of a process is renewed by one `UPDATE … FROM unnest(…)` per tick, over
  one connection; the renewal statement's latency is what a thousand leases cost per second.
"""


def render(rows: list[Row], quick: bool) -> str:
    lines = [
        "| measure | result | target | verdict |",
        "|---|---|---|---|",
        *(f"| {r.measure} | {r.value} | {r.target} | {r.verdict} |" for r in rows),
    ]
    mode = "quick mode (one pass, small sizes)" if quick else "full mode"
    return f"Measured {time.strftime('%Y-%m-%d')}, {mode}.\n\n" + "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    """Wall time of a CLI run relative to the floor: ours and 0.1.0's, per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars: list[tuple[str, float, str]] = []
    for row in rows:
        if "/ floor" in row.measure:
            strategy = row.measure.split(",")[1].split(":")[0].strip()
            bars.append((f"ours, {strategy}", float(row.value.split()[0]), "#4a7ab5"))
        elif "ours / dislock 0.1.0" in row.measure and "x floor" in row.value:
            strategy = row.measure.split(",")[1].split(":")[0].strip()
            theirs = float(row.value.split("0.1.0: ")[1].split()[0])
            bars.append((f"dislock 0.1.0, {strategy}", theirs, "#a0a0a0"))
    figure, axis = plt.subplots(figsize=(7, 2.8))
    axis.barh([b[0] for b in bars], [b[1] for b in bars], color=[b[2] for b in bars])
    axis.invert_yaxis()
    axis.axvline(1.0, color="black", linewidth=0.8)
    axis.axvline(1.05, color="#b54a4a", linestyle="--", linewidth=0.8, label="target 1.05")
    axis.set_xlim(0, max([1.2] + [b[1] * 1.08 for b in bars]))
    axis.set_xlabel("median wall time / floor (python + psycopg + one connection)")
    axis.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--only",
        help="comma-separated parts to run (cli, import, cycle, roles, race, waiting, herd,"
        " scale, hot, history, serve); prints their rows and writes nothing",
    )
    parser.add_argument(
        "--only-waiting", action="store_true", help="only the waiting and slot measures (printed)"
    )
    parser.add_argument(
        "--herd",
        type=int,
        metavar="N",
        help="only the herd, N machines against a role capped at --herd-cap (printed)",
    )
    parser.add_argument("--herd-cap", type=int, default=50, metavar="C")
    args = parser.parse_args()
    parts = set(args.only.split(",")) if args.only else None
    repeat = 1 if args.quick else 9
    # What pip does on install, so that our modules are not compiled on every
    # run when the environment disables writing bytecode (editable installs).
    compileall.compile_dir(ROOT / "packages", quiet=1)
    with postgres_url("BENCH_DATABASE_URL") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(create_table_sql(("key_value",)))
        if args.only_waiting:
            print(render(waiting_rows(url, 5 if args.quick else 40), args.quick))
            return 0
        if args.herd:
            print(render(herd_rows(url, args.herd, args.herd_cap), args.quick))
            return 0
        measures: list[tuple[str, Callable[[], list[Row]]]] = [
            ("cli", partial(cli_rows, url, repeat)),
            ("import", partial(import_rows, 3 if args.quick else 15)),
            ("cycle", partial(cycle_rows, url, 10 if args.quick else 150)),
            ("roles", partial(roles_rows, url, repeat, 10 if args.quick else 150)),
            ("race", partial(race_rows, url, 32)),
            ("waiting", partial(waiting_rows, url, 5 if args.quick else 40)),
            ("herd", partial(herd_rows, url, 50 if args.quick else 200, 20)),
            ("scale", partial(lease_scale_rows, url, 50 if args.quick else 1000)),
            (
                "hot",
                partial(hot_rows, url, 50 if args.quick else 1000, 4.0 if args.quick else 300.0),
            ),
            (
                "history",
                partial(
                    history_rows,
                    url,
                    10 if args.quick else 200,
                    10_000 if args.quick else HISTORY_ROWS,
                ),
            ),
            ("serve", partial(serve_rows, url, *SERVE_SIZES[args.quick])),
        ]
        rows = []
        for name, measure in measures:
            if parts is None or name in parts:
                rows += measure()
    table = render(rows, args.quick)
    print(table)
    if not args.no_write and parts is None:
        (ROOT / "docs" / "benchmarks.md").write_text(
            "# Benchmarks\n\nGenerated by `hatch run bench` (see `benchmarks/run.py`): medians,"
            " and ratios measured side by side in one run on the same machine.\n\n"
            + table
            + "\n\n![CLI wall time relative to the floor](benchmarks.png)\n\n"
            + READING
        )
        plot(rows, ROOT / "docs" / "benchmarks.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
