"""``grant``, ``revoke`` and ``init`` change a lock table in use: a role that keeps a
transaction open on it must not turn them into an outage of every other team.

Without a short lock wait, the change queues for the table's ACCESS EXCLUSIVE lock
behind the open read, and every acquisition of every team queues behind the change
(PostgreSQL grants table locks in order): the acquisitions below would wait for the
reader, ten seconds, and fail on their statement timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock import LeaseLock, LockContext
from tests.security.conftest import READER_ROLE, Fleet, ctl
from tests.support.eventually import eventually

CTL = [sys.executable, "-m", "dislock.cli.ctl", "DISLOCK_ADMIN_URL"]


@contextmanager
def open_read(fleet: Fleet, url: str) -> Iterator[psycopg.Connection[Any]]:
    """A session of ``url``'s role inside a transaction that has read the lock table."""
    # Not autocommit: the read's transaction stays open.  Nothing prepared: the
    # suite also runs through PgBouncer in transaction pooling.
    with psycopg.connect(url, prepare_threshold=None) as conn:
        conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(*fleet.table)))
        yield conn


def start_ctl(fleet: Fleet, *args: str) -> subprocess.Popen[str]:
    env = {"PATH": os.environ["PATH"], "DISLOCK_ADMIN_URL": fleet.admin_url}
    return subprocess.Popen(
        [*CTL, "--table", ".".join(fleet.table), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextmanager
def stopped_on_failure(process: subprocess.Popen[str]) -> Iterator[None]:
    """Kills ``process`` and closes its pipes if the block fails, so a failed
    assertion is reported as itself and not also as unclosed files."""
    try:
        yield
    except BaseException:
        process.kill()
        process.communicate()
        raise


def acquisition_seconds(fleet: Fleet) -> float:
    """How long another team's wrapper takes to take and release a lease."""
    context = LockContext(
        url=fleet.reports,
        table_parts=list(fleet.table),
        lock_key=f"reports-{uuid.uuid4().hex[:8]}",
        run_ttl_seconds=5.0,
        lease_interval_seconds=1.0,
    )
    started = time.monotonic()
    with LeaseLock(context):
        pass
    return time.monotonic() - started


@pytest.mark.parametrize(
    "change",
    [
        ("revoke", READER_ROLE),
        ("grant", READER_ROLE, "--reader"),
    ],
    ids=["revoke", "grant"],
)
def test_a_change_behind_an_open_read_holds_no_other_team_up(
    fleet: Fleet, change: tuple[str, ...]
) -> None:
    with open_read(fleet, fleet.reader) as reader:
        (reader_pid,) = reader.execute("SELECT pg_backend_pid()").fetchone() or (0,)
        process = start_ctl(fleet, *change, "--wait", "3")
        took: list[float] = []
        deadline = time.monotonic() + 60
        with stopped_on_failure(process):
            while process.poll() is None and time.monotonic() < deadline:
                took.append(acquisition_seconds(fleet))
        out, err = process.communicate(timeout=30)
    # Each of the acquisitions made while the change was trying got through at once.
    assert len(took) >= 3, (took, err)
    assert max(took) < 1.0, took
    # Out of patience, one line names the role holding the table and its session.
    assert process.returncode == 1, (out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{change[0]} gave up after 3 s" in err, err
    assert f"role '{READER_ROLE}' (pid {reader_pid}" in err, err
    assert f"pg_terminate_backend({reader_pid})" in err, err


def test_a_revoke_goes_through_once_the_read_ends(fleet: Fleet) -> None:
    with open_read(fleet, fleet.reader):
        process = start_ctl(fleet, "revoke", READER_ROLE, "--wait", "60")
        waiting = sql.SQL(
            "SELECT 1 FROM pg_locks WHERE NOT granted AND relation = to_regclass({})"
        ).format(sql.Literal(sql.Identifier(*fleet.table).as_string(None)))
        # Polled hundreds of times on one session: fleet.connect prepares nothing,
        # which PgBouncer in transaction pooling would lose between transactions.
        with fleet.connect(fleet.admin_url) as admin, stopped_on_failure(process):
            # Seen trying (waiting for its lock) before the read ends.
            eventually(
                lambda: process.poll() is None and admin.execute(waiting).fetchone(),
                timeout=30,
                interval=0.005,
                message="the revoke was never seen waiting for the table",
            )
            assert process.poll() is None
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, (out, err)
    with pytest.raises(psycopg.errors.InsufficientPrivilege), fleet.connect(fleet.reader) as r:
        r.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(*fleet.table)))


def test_a_wait_that_is_not_a_duration_is_one_line(fleet: Fleet) -> None:
    status, _, err = ctl(
        fleet.admin_url, "revoke", READER_ROLE, "--wait", "soon", table=fleet.table
    )
    assert status == 2 and err.count("\n") == 1 and "--wait" in err, err
