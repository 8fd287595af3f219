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
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dislock.core.sql import create_table_sql  # noqa: E402
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
    ours = [str(Path(sys.executable).parent / "dislock")]
    floor_cmd = [sys.executable, "-c", FLOOR]
    rows = []
    with old_dislock() as old:
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
                    f"CLI `dislock URL true`, {strategy}: ours / floor",
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


def cycle_rows(url: str, cycles: int) -> list[Row]:
    from dislock import LeaseLock, LockContext

    context = LockContext(
        url=url,
        table_parts=["key_value"],
        lock_key="bench-cycle",
        owner=f"bench:{os.getpid()}",
        run_ttl_seconds=60.0,
        lease_interval_seconds=10.0,
    )
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as warm:
        # A session counts as one transaction in pg_stat_database by itself.
        before = commits(warm)
        for _ in range(cycles):
            psycopg.connect(url).close()
        per_connection = (commits(warm) - before - 1) / cycles
        started = time.perf_counter()
        for _ in range(cycles):
            warm.execute("SELECT 1")
            warm.execute("SELECT 1")
        baseline = (time.perf_counter() - started) / cycles
        before = commits(warm)
        started = time.perf_counter()
        for _ in range(cycles):
            with LeaseLock(context):
                pass
        ours = (time.perf_counter() - started) / cycles
        # Each cycle: the acquiring connection and the releasing one.
        per_cycle = (commits(warm) - before - 1) / cycles - 2 * per_connection
    return [
        Row(
            "acquire + release, per cycle / two `SELECT 1` round trips",
            f"{ours / baseline:.1f} ({ours * 1000:.2f} ms / {baseline * 1000:.2f} ms)",
            "≤ 1.3",
            "missed: each cycle opens two connections (no warm-connection API yet)"
            if ours / baseline > 1.3
            else "met",
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
        started = time.perf_counter()
        running = [subprocess.Popen(command, env=env) for _ in range(processes)]
        durations = []
        for process in running:
            process.wait()
            durations.append(time.perf_counter() - started)
        count = len(starts.read_text().splitlines()) if starts.exists() else 0
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
    ]


@asynccontextmanager
async def many_leases(
    url: str, table: str, leases: int, ttl: float, interval: float
) -> AsyncIterator[None]:
    """``leases`` asyncio leases held at once in this process."""
    import dislock.aio
    from dislock import LockContext

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
    for lock in locks:
        await lock.__aenter__()
    try:
        yield
    finally:
        for lock in locks:
            await lock.__aexit__(None, None, None)


def lease_scale_rows(url: str, leases: int) -> list[Row]:
    async def connections_used() -> int:
        async with many_leases(url, "key_value", leases, ttl=30.0, interval=5.0):
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dislock'"
                ).fetchone()
        assert row is not None
        return int(str(row[0]))

    used = asyncio.run(connections_used())
    return [
        Row(
            f"{leases} concurrent leases in one asyncio process: server connections",
            f"{used} ({used / leases:.1f} per lease)",
            "≤ 10 for 1,000 leases",
            "missed: one connection per lease (process-wide renewer not built yet)"
            if used > 10
            else "met",
        ),
    ]


def hot_rows(url: str, leases: int, seconds: float) -> list[Row]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS hot_locks")
        conn.execute(create_table_sql(("hot_locks",)))
        conn.execute("SELECT pg_stat_reset()")

        async def renew_for_a_while() -> None:
            async with many_leases(url, "hot_locks", leases, ttl=3.0, interval=1.0):
                await asyncio.sleep(seconds)

        asyncio.run(renew_for_a_while())
        time.sleep(0.6)
        stats = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd, pg_relation_size('hot_locks')"
            " FROM pg_stat_user_tables WHERE relname = 'hot_locks'"
        ).fetchone()
    assert stats is not None
    updates, hot, size = (int(str(value)) for value in stats)
    share = hot / updates if updates else 0.0
    return [
        Row(
            f"{leases} leases renewed every second for {seconds:.0f} s: HOT updates",
            f"{share:.0%} of {updates}",
            "≥ 95 %",
            "met" if share >= 0.95 else "missed",
        ),
        Row("  table size", f"{size // 1024} KiB", "flat after the first minute", "report"),
    ]


def render(rows: list[Row], quick: bool) -> str:
    lines = [
        "| measure | result | target | verdict |",
        "|---|---|---|---|",
        *(f"| {r.measure} | {r.value} | {r.target} | {r.verdict} |" for r in rows),
    ]
    mode = "quick mode (one pass, small sizes)" if quick else "full mode"
    return f"Measured {time.strftime('%Y-%m-%d')}, {mode}.\n\n" + "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = [
        (r.measure.split(":")[0], float(r.value.split()[0])) for r in rows if "/ floor" in r.measure
    ]
    figure, axis = plt.subplots(figsize=(7, 2.5))
    axis.barh([name for name, _ in ratios], [ratio for _, ratio in ratios], color="#4a7ab5")
    axis.axvline(1.0, color="black", linewidth=0.8)
    axis.axvline(1.05, color="#b54a4a", linestyle="--", linewidth=0.8, label="target 1.05")
    axis.set_xlabel("median wall time / floor (python + psycopg + one connection)")
    axis.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    repeat = 1 if args.quick else 9
    with postgres_url("BENCH_DATABASE_URL") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(create_table_sql(("key_value",)))
        rows = cli_rows(url, repeat)
        rows += import_rows(3 if args.quick else 15)
        rows += cycle_rows(url, 20 if args.quick else 200)
        rows += race_rows(url, 32)
        rows += lease_scale_rows(url, 10 if args.quick else 80)
        rows += hot_rows(url, 5 if args.quick else 50, 3.0 if args.quick else 60.0)
    table = render(rows, args.quick)
    print(table)
    if not args.no_write:
        (ROOT / "docs" / "benchmarks.md").write_text(
            "# Benchmarks\n\nGenerated by `hatch run bench` (see `benchmarks/run.py`): medians,"
            " and ratios measured side by side in one run on the same machine.\n\n"
            + table
            + "\n\n![CLI wall time relative to the floor](benchmarks.png)\n"
        )
        plot(rows, ROOT / "docs" / "benchmarks.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
