"""Outages of the server and the network, on a cluster of the test's own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dislock import LeaseLostError, LockContext
from dislock.core.rows import lease_key
from dislock.core.table import create_table_sql
from tests.cli.conftest import DISLOCK
from tests.support.cluster import Cluster
from tests.support.drivers import AioDriver, Driver, SyncDriver
from tests.support.eventually import wait_for
from tests.support.proxy import BlackholeProxy

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    server = Cluster()
    server.start()
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(create_table_sql(("key_value",)))
    yield server
    server.destroy()


def wrapper(
    url: str, script: str, ttl: float, interval: float, key: str = "job"
) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "LOCK_KEY": key,
        "LOCK_STRATEGY": "lease",
        "RUN_LOCK_TTL_SECONDS": str(ttl),
        "LOCK_LEASE_INTERVAL": str(interval),
    }
    return subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", script], env=env, stderr=subprocess.PIPE, text=True
    )


def lease_row(url: str, key: str = "job") -> tuple[str, float] | None:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT value, extract(epoch FROM expire_at)::float8 FROM key_value WHERE key = %s",
            (lease_key(key),),
        ).fetchone()
    return None if row is None else (row[0], row[1])


def test_restart_shorter_than_the_ttl_is_ridden_out(cluster: Cluster, tmp_path: Path) -> None:
    started = tmp_path / "started"
    # 11 s of work under an 8 s lease: it only finishes if renewals resume after the
    # restart.  The TTL leaves a loaded machine's stop and start (around the 1.5 s
    # down) several seconds: the outage must stay shorter than it.
    process = wrapper(cluster.url, f'touch "{started}"; sleep 11; exit 3', ttl=8.0, interval=0.5)
    wait_for(started)
    time.sleep(1.0)
    cluster.restart_after(1.5)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 3, stderr  # the command's own status, not 75
    assert "retrying until its deadline" in stderr  # the outage was seen and ridden out


def test_outage_longer_than_the_ttl_terminates_the_command(
    cluster: Cluster, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    process = wrapper(cluster.url, f'touch "{started}"; sleep 60', ttl=2.0, interval=0.3)
    wait_for(started)
    cluster.stop()
    stopped_at = time.monotonic()
    try:
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 75, stderr  # never a clean success
        # The TTL, not a TCP timeout or the 30 s above (generous: a loaded machine).
        assert time.monotonic() - stopped_at < 2.0 + 10.0
    finally:
        cluster.start()


def test_sigkilled_holder_is_replaced_once_its_row_expires_and_not_before(
    cluster: Cluster, tmp_path: Path
) -> None:
    ttl, interval = 2.0, 0.3
    holder_script = textwrap.dedent(
        f"""
        import time
        from dislock import LeaseLock, LockContext
        context = LockContext(url={cluster.url!r}, table_parts=["key_value"], lock_key="job",
                              owner="doomed", run_ttl_seconds={ttl},
                              lease_interval_seconds={interval})
        with LeaseLock(context):
            open({str(tmp_path / "started")!r}, "w").close()
            time.sleep(600)
        """
    )
    holder = subprocess.Popen([sys.executable, "-c", holder_script])
    wait_for(tmp_path / "started")
    time.sleep(0.5)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    killed_at = time.time()
    final = lease_row(cluster.url)
    assert final is not None and final[0] == "doomed"
    expiry = final[1]

    from dislock import LeaseLock, LockContext, LockNotAcquiredError

    context = LockContext(
        url=cluster.url,
        table_parts=["key_value"],
        lock_key="job",
        owner="successor",
        run_ttl_seconds=30.0,
        lease_interval_seconds=5.0,
    )
    while True:
        try:
            with LeaseLock(context):
                row = lease_row(cluster.url)
                break
        except LockNotAcquiredError:
            assert time.time() < killed_at + ttl + interval + 10.0, "never acquired"
            time.sleep(0.05)
    assert row is not None and row[0] == "successor"
    acquired_at = row[1] - 30.0  # expire_at = the acquiring statement's NOW() + TTL
    assert acquired_at >= expiry  # never before the dead holder's row expired
    assert expiry - killed_at <= ttl  # its last renewal came before the kill
    # Soon after: a retry every 50 ms, each a connection and a statement, which a
    # loaded machine can stretch to a few seconds.
    assert acquired_at - expiry <= 5.0


def test_blackholed_connection_stops_the_command_before_the_row_expires(
    cluster: Cluster, tmp_path: Path
) -> None:
    proxy = BlackholeProxy(("127.0.0.1", cluster.port))
    try:
        started, termed = tmp_path / "started", tmp_path / "termed"
        script = (
            f'trap \'date +%s.%N > "{termed}"; exit 0\' TERM; touch "{started}"; '
            "while :; do sleep 0.05; done"
        )
        url = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
        process = wrapper(url, script, ttl=5.0, interval=0.3)
        wait_for(started)
        time.sleep(1.0)
        proxy.blackhole()
        cut_at = time.monotonic()
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 75, stderr
        assert time.monotonic() - cut_at < 5.0 + 6.0  # nothing waited on TCP timeouts
        row = lease_row(cluster.url)  # straight to the server, around the proxy
        assert row is not None
        assert float(termed.read_text()) < row[1]  # stopping before the row was free
    finally:
        proxy.close()


@pytest.mark.parametrize("driver_class", [SyncDriver, AioDriver], ids=["sync", "aio"])
def test_a_renewer_stuck_on_a_dead_connection_is_replaced(
    cluster: Cluster, driver_class: type[Driver]
) -> None:
    """The shared connection goes silent (statements and their cancellation are
    swallowed, new connections still get through): a lease taken afterwards on a
    new connection is still renewed, so the renewer stuck on the old one was
    replaced rather than waited for."""
    proxy = BlackholeProxy(("127.0.0.1", cluster.port))
    driver = driver_class()
    ttl = 1.5
    try:
        url = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"

        def context(key: str) -> LockContext:
            return LockContext(
                url=url,
                table_parts=["key_value"],
                lock_key=key,
                owner=f"owner-{key}",
                run_ttl_seconds=ttl,
                lease_interval_seconds=0.2,
            )

        first = driver.hold(context("first"), ["lease"])
        proxy.cut_existing()
        assert first.wait_lease_lost(timeout=ttl + 10.0)
        second = driver.hold(context("second"), ["lease"])
        acquired = lease_row(cluster.url, "second")
        time.sleep(ttl + 1.5)  # lost by now without renewals
        renewed = lease_row(cluster.url, "second")
        assert second.lease_lost_event_set() is False
        assert acquired is not None and renewed is not None and renewed[1] > acquired[1]
        second.release()
        with pytest.raises(LeaseLostError):
            first.release()
    finally:
        proxy.close()
        # The stuck statement fails once its socket closes, and then closes its
        # connection: give that a moment before the event loop goes away.
        time.sleep(0.5)
        driver.close()
