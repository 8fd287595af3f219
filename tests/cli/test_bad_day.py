"""The wrapper on a bad day: its database goes away while a lease job runs.

A server of the test's own is stopped and started again.  The renewer's output
says the first failure in full and then one line with the count (when renewals
succeed again, or before the loss line), and a run that lost its lease records
``lease_lost`` once the server is back, within the connect patience, rather
than being read later as ``abandoned``.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dislock.core.history import create_history
from dislock.core.table import create_table_sql
from tests.cli.conftest import DISLOCK
from tests.support.cluster import Cluster
from tests.support.eventually import wait_for

pytestmark = pytest.mark.slow

FAILED = "renewal of lease cronjob-lock:lease:job failed, retrying until its deadline"
LOST = "lease lost for lock 'job'"


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    server = Cluster()
    server.start()
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(create_table_sql(("key_value",)))
        for statement in create_history(("key_value_history",)):
            conn.execute(statement)
    yield server
    server.destroy()


class Wrapper:
    """A lease job under the wrapper, its stderr read line by line as it comes."""

    def __init__(
        self, url: str, script: str, ttl: float, interval: float, **variables: str
    ) -> None:
        env = {key: value for key, value in os.environ.items() if not key.startswith("LOCK_")}
        env.update(
            DATABASE_URL=url,
            LOCK_KEY="job",
            LOCK_STRATEGY="lease",
            LOCK_HISTORY="1",
            RUN_LOCK_TTL_SECONDS=str(ttl),
            LOCK_LEASE_INTERVAL=str(interval),
            LOCK_CONNECT_PATIENCE_SECONDS="120",
        )
        env.update(variables)
        self.process = subprocess.Popen(
            [*DISLOCK, "DATABASE_URL", "sh", "-c", script],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def wait_for_line(self, pattern: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                found = next((line for line in self.lines if re.search(pattern, line)), None)
            if found is not None:
                return found
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} in: {self.lines}")

    def finish(self, timeout: float = 120.0) -> int:
        status = self.process.wait(timeout=timeout)
        self._reader.join(timeout=30)
        assert self.process.stderr is not None
        self.process.stderr.close()
        return status


def outcome(url: str) -> tuple[str | None, int | None]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT outcome, exit_code FROM key_value_history").fetchone()
    assert row is not None
    return row[0], row[1]


def test_an_outage_past_the_ttl_is_one_failure_a_count_and_a_recorded_loss(
    cluster: Cluster, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    wrapper = Wrapper(cluster.url, f'touch "{started}"; exec sleep 600', ttl=3.0, interval=0.3)
    try:
        wait_for(started, timeout=60)
        cluster.stop()
        # The loss comes at the TTL's deadline, after many failed attempts; only
        # then does the server come back (the wrapper is waiting to record the end).
        wrapper.wait_for_line(re.escape(LOST))
        cluster.start()
        assert wrapper.finish() == 75, wrapper.lines
    finally:
        if wrapper.process.poll() is None:
            wrapper.process.kill()
            wrapper.finish()
    lines = wrapper.lines
    assert sum(FAILED in line for line in lines) == 1, lines
    counted = [(i, re.search(r"failed (\d+) times over", line)) for i, line in enumerate(lines)]
    summary = [(i, int(found.group(1))) for i, found in counted if found is not None]
    loss = [i for i, line in enumerate(lines) if LOST in line]
    assert len(summary) == 1 and len(loss) == 1 and summary[0][0] < loss[0], lines
    assert summary[0][1] >= 2
    assert any("recorded the end of job: lease_lost" in line for line in lines), lines
    assert outcome(cluster.url) == ("lease_lost", 75)


def test_an_outage_ridden_out_is_one_failure_and_one_recovery(
    cluster: Cluster, tmp_path: Path
) -> None:
    started, go_on = tmp_path / "started", tmp_path / "go-on"
    # The command ends once told to: after the server is back and renewed.
    script = f'touch "{started}"; while [ ! -e "{go_on}" ]; do sleep 0.1; done; exit 3'
    wrapper = Wrapper(cluster.url, script, ttl=20.0, interval=0.3)
    try:
        wait_for(started, timeout=60)
        cluster.stop()
        # Several attempts fail while it is down (one every heartbeat).
        wrapper.wait_for_line(FAILED)
        time.sleep(1.5)
        cluster.start()
        recovered = wrapper.wait_for_line(r"succeeded again after \d+ failed attempt")
        go_on.touch()
        assert wrapper.finish() == 3, wrapper.lines
    finally:
        if wrapper.process.poll() is None:
            wrapper.process.kill()
            wrapper.finish()
    assert sum(FAILED in line for line in wrapper.lines) == 1, wrapper.lines
    assert "lease cronjob-lock:lease:job" in recovered
    assert outcome(cluster.url) == ("failed", 3)


def test_an_end_the_database_never_took_is_kept_and_recorded_by_the_next_run(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Past the connect patience, the end of a run whose database stayed away is
    kept on the host, and the next run with history there records it, with the
    time it really ended: the run does not read as abandoned."""
    started = tmp_path / "started"
    state = tmp_path / "state"
    wrapper = Wrapper(
        cluster.url,
        f'touch "{started}"; exec sleep 600',
        ttl=3.0,
        interval=0.3,
        LOCK_CONNECT_PATIENCE_SECONDS="1",
        XDG_STATE_HOME=str(state),
    )
    try:
        wait_for(started, timeout=60)
        cluster.stop()
        wrapper.wait_for_line(re.escape(LOST))
        assert wrapper.finish() == 75, wrapper.lines
    finally:
        if wrapper.process.poll() is None:
            wrapper.process.kill()
            wrapper.finish()
    ended = time.time()
    (kept,) = (state / "dislock" / "unrecorded").iterdir()
    assert any(f"kept in {kept}" in line for line in wrapper.lines), wrapper.lines
    cluster.start()
    assert outcome(cluster.url) == (None, None)  # abandoned, as far as the table knows

    env = {key: value for key, value in os.environ.items() if not key.startswith("LOCK_")}
    env.update(
        DATABASE_URL=cluster.url,
        LOCK_KEY="another-job",
        LOCK_STRATEGY="lease",
        LOCK_HISTORY="1",
        XDG_STATE_HOME=str(state),
        CRONJOB_LOCK_LOG_LEVEL="INFO",
    )
    later = subprocess.run(
        [*DISLOCK, "DATABASE_URL", "true"], env=env, capture_output=True, text=True, timeout=60
    )
    assert later.returncode == 0, later.stderr
    assert "recorded the end of run 1 (lease_lost at " in later.stderr, later.stderr
    assert not kept.exists()
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT lock_key, outcome, exit_code, extract(epoch FROM ended_at)"
            " FROM key_value_history ORDER BY id"
        ).fetchall()
    (lock_key, recorded, code, ended_at), (another, *_) = rows
    assert (lock_key, recorded, code) == ("job", "lease_lost", 75)
    assert ended_at <= ended  # when it ended, not when it was recorded
    assert another == "another-job"
