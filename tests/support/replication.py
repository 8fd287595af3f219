"""A primary and a streaming standby of the test's own, for failover tests.

The standby is a ``pg_basebackup -R`` of the primary; it reports itself to the
primary as ``standby1`` (its ``cluster_name``), the name
``synchronous_standby_names`` refers to.  Failing over is what an HA manager
does after the primary dies: ``pg_ctl -m immediate stop`` (no shutdown
checkpoint, nothing more sent to the standby), then ``pg_ctl promote``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from tests.support.cluster import Cluster
from tests.support.eventually import eventually

STANDBY_NAME = "standby1"


class Pair:
    """A primary with one streaming standby, both on loopback ports."""

    def __init__(self) -> None:
        self.primary = Cluster(options="-c wal_level=replica -c max_wal_senders=4")
        self.primary.start()
        self.standby = Cluster(initialise=False, options=f"-c cluster_name={STANDBY_NAME}")
        self.standby._run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary.port),
            "-U",
            "postgres",
            "-D",
            str(self.standby.data),
            "-R",
            "-X",
            "stream",
            "--no-sync",
        )
        self.standby.start()
        self.wait_streaming()

    def url(self, *, both: bool = True) -> str:
        """A multi-host URL (the way to point dislock at an HA pair), or the primary's."""
        if not both:
            return self.primary.url
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"

    def sql(self, cluster: Cluster, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def set_primary(self, **settings: str) -> None:
        """``ALTER SYSTEM`` on the primary, then reload."""
        for name, value in settings.items():
            self.sql(self.primary, f"ALTER SYSTEM SET {name} = '{value}'")
        self.sql(self.primary, "SELECT pg_reload_conf()")
        # The reload reaches the server asynchronously: wait until a new connection
        # (as every test's wrapper opens) sees every setting.
        deadline = time.monotonic() + 30
        while any(
            self.sql(self.primary, f"SHOW {name}") != [(value,)] for name, value in settings.items()
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the primary did not take {settings}")
            time.sleep(0.05)

    def wait_streaming(self, timeout: float = 30.0) -> None:
        """Until the standby streams and has replayed everything the primary wrote."""
        deadline = time.monotonic() + timeout
        while True:
            rows = self.sql(
                self.primary,
                "SELECT pg_current_wal_lsn() <= replay_lsn FROM pg_stat_replication"
                " WHERE application_name = %s AND state = 'streaming'",
                (STANDBY_NAME,),
            )
            if rows and rows[0][0]:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("the standby did not catch up")
            time.sleep(0.1)

    def pause_replay(self) -> None:
        self.sql(self.standby, "SELECT pg_wal_replay_pause()")

    def fail_over(self) -> None:
        """Crash the primary, promote the standby; the roles swap."""
        self.primary.stop("immediate")
        self.standby._run("pg_ctl", "-D", str(self.standby.data), "-w", "promote")
        self.primary, self.standby = self.standby, self.primary

    def destroy(self) -> None:
        self.primary.destroy()
        self.standby.destroy()


@contextlib.contextmanager
def synchronous_standby_nowhere(db: psycopg.Connection[Any], url: str) -> Iterator[None]:
    """The test server's commits wait for a synchronous standby that does not exist,
    where ``synchronous_commit`` is ``on`` (every session's default); ``db`` commits
    locally meanwhile (``synchronous_standby_names`` is the server's alone: ``ALTER
    SYSTEM``, reset afterwards)."""
    db.execute("SET synchronous_commit = local")

    def configure(statement: str, expected: str) -> None:
        db.execute(statement)
        db.execute("SELECT pg_reload_conf()")

        def applied() -> bool:  # the postmaster rereads its configuration in a while
            with psycopg.connect(url, autocommit=True) as fresh:
                row = fresh.execute("SHOW synchronous_standby_names").fetchone()
            return row is not None and row[0] == expected

        eventually(applied, timeout=30, message="the configuration was not reloaded")

    configure("ALTER SYSTEM SET synchronous_standby_names = 'dislock_test_nowhere'", NOWHERE)
    try:
        yield
    finally:
        configure("ALTER SYSTEM RESET synchronous_standby_names", "")


NOWHERE = "dislock_test_nowhere"
