"""The scheduler recipes of docs/recipes.md, run as they are: three replicas at once.

Each recipe is a file under examples/ that docs/recipes.md shows in full (checked here, so
the page and the code cannot drift). Three processes of it run against a database of their
own for ``RUN_SECONDS``; from their output: exactly one report per 5-second slot while all
three were up (at most one in any slot), and the import, which lasts longer than the time
between its starts, never running in two places at once.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from dislock.core.table import create_table_sql

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
REPLICAS = 3
RUN_SECONDS = 40
SLOT_SECONDS = 5
SLOT_LOG = re.compile(r"acquired schedule slot \S*:report until (\S+)")
READY = {
    "apscheduler_background": ("Scheduler started",),
    "apscheduler_asyncio": ("Scheduler started",),
    "celery_beat": (" ready.", "beat: Starting"),
}
# Each replica's command line, as docs/recipes.md gives it.
CELERY_WORKER = (
    "celery -A examples.celery_beat worker -B --pool=solo --without-mingle --without-gossip"
    " --loglevel=INFO"
)


def recipe_in_docs(name: str) -> str:
    """The recipe's file, after checking that docs/recipes.md shows it verbatim."""
    code = (ROOT / "examples" / f"{name}.py").read_text()
    page = (ROOT / "docs" / "recipes.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", page, flags=re.M | re.S)
    assert code in blocks, f"docs/recipes.md does not show examples/{name}.py as it is"
    return code


@dataclass
class Run:
    outputs: list[str]
    ready: float
    """When every replica was up."""
    stopped: float
    """When they were told to stop."""


@pytest.fixture
def recipe_url(db: psycopg.Connection[Any], database_url: str) -> Iterator[str]:
    """A database of the test's own with the lock table of the recipes (``key_value``)."""
    name = f"recipe_{secrets.token_hex(4)}"
    db.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_conninfo(database_url, dbname=name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(create_table_sql(("key_value",)))
    yield url
    db.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def replicas(name: str, command: list[str], envs: list[dict[str, str]], logs: Path) -> Run:
    """Run a process of ``command`` in each of ``envs`` for ``RUN_SECONDS`` once all are ready."""
    paths = [logs / f"{name}-{n}.log" for n in range(len(envs))]
    processes = []
    for path, env in zip(paths, envs, strict=True):
        with path.open("w") as out:
            processes.append(
                subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            )
    try:
        deadline = time.monotonic() + 120
        while not all(all(m in path.read_text() for m in READY[name]) for path in paths):
            for process, path in zip(processes, paths, strict=True):
                assert process.poll() is None, f"{name} exited early:\n{path.read_text()}"
            assert time.monotonic() < deadline, "the replicas did not start within 120 s"
            time.sleep(0.2)
        ready = time.time()
        time.sleep(RUN_SECONDS)  # the replicas at work: what is checked is their output
        stopped = time.time()
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    return Run([path.read_text() for path in paths], ready, stopped)


def check(run: Run) -> None:
    joined = "\n".join(run.outputs)
    # One start per slot: every slot's end, as each acquisition logged it.
    ends = Counter(
        round(datetime.fromisoformat(end).timestamp()) for end in SLOT_LOG.findall(joined)
    )
    assert ends, joined
    assert max(ends.values()) == 1, f"a slot started twice: {ends}"
    reports = len(re.findall(r"^report ran at ", joined, flags=re.M))
    assert reports == sum(ends.values()), joined
    # Every slot that began and ended while all three replicas were up started once.
    first = (int(run.ready) // SLOT_SECONDS + 2) * SLOT_SECONDS
    expected = range(first, int(run.stopped) - SLOT_SECONDS, SLOT_SECONDS)
    missing = [end for end in expected if ends[end] != 1]
    assert len(expected) >= 5 and not missing, f"slots ending at {missing} never started: {ends}"

    # The import: one at a time across the replicas, whoever runs it.
    intervals: list[tuple[float, float]] = []
    for output in run.outputs:
        starts = [float(t) for t in re.findall(r"^import started at (\S+)", output, flags=re.M)]
        stops = [float(t) for t in re.findall(r"^import ended at (\S+)", output, flags=re.M)]
        assert len(starts) == len(stops), output
        intervals += zip(starts, stops, strict=True)
    intervals.sort()
    assert len(intervals) >= 3, joined
    for (_, end), (start, _) in itertools.pairwise(intervals):
        assert start >= end, f"two imports at once: {intervals}"
    tracebacks = [output for output in run.outputs if "Traceback" in output]
    assert not tracebacks, tracebacks[0][max(0, tracebacks[0].index("Traceback") - 500) :][:6000]


@pytest.mark.parametrize("name", ["apscheduler_background", "apscheduler_asyncio"])
def test_apscheduler_recipe_in_three_replicas(name: str, recipe_url: str, tmp_path: Path) -> None:
    recipe_in_docs(name)
    envs = [{**os.environ, "DATABASE_URL": recipe_url}] * REPLICAS
    check(replicas(name, [sys.executable, "-m", f"examples.{name}"], envs, tmp_path))


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A Redis server of the test's own, on a Unix socket (Debian's redis-server)."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip(
            "no redis-server on this machine (Debian: apt-get install redis-server; .ci/run does)"
        )
    home = Path(tempfile.mkdtemp(prefix="dislock-redis-"))  # a socket path must be short
    socket = home / "redis.sock"
    process = subprocess.Popen(
        [
            server,
            "--port",
            "0",
            "--unixsocket",
            str(socket),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(home),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not socket.exists():
            assert process.poll() is None, "redis-server exited at start"
            assert time.monotonic() < deadline, "redis-server did not start within 30 s"
            time.sleep(0.05)
        yield f"redis+socket://{socket}"
    finally:
        process.terminate()
        process.wait(timeout=30)
        shutil.rmtree(home, ignore_errors=True)


def test_celery_beat_recipe_in_three_replicas(
    recipe_url: str, redis_url: str, tmp_path: Path
) -> None:
    recipe_in_docs("celery_beat")
    assert CELERY_WORKER in (ROOT / "docs" / "recipes.md").read_text()
    # One broker for the three replicas, as in production: each beat sends every task,
    # and the three workers race for the messages and for the locks.
    envs = [{**os.environ, "DATABASE_URL": recipe_url, "CELERY_BROKER_URL": redis_url}] * REPLICAS
    command = [sys.executable, "-m", *CELERY_WORKER.split()]
    check(replicas("celery_beat", command, envs, tmp_path))
