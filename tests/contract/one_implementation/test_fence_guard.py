"""Fencing enforced by the database (``dislockctl fence``): a guarded table of the
user's commits a write only while the transaction's ``dislock.fencing_token`` is the
token of the key's live lease.  The token is set per transaction with
``set_fencing_token`` (what works behind PgBouncer too: CI runs this file there), and
a takeover before the commit's check fails the commit; the check holds no lock."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import dislock.aio
from dislock import ConfigurationError, LeaseLock, LockContext, set_fencing_token
from dislock.cli.admin import init_statements
from dislock.core.fencing import fence_statements, guard_sql
from dislock.core.rows import lease_key
from tests.support.eventually import eventually, wait_for

KEY = "nightly"
Write = Callable[..., str | None]


@pytest.fixture
def report(db: psycopg.Connection[Any], lock_table: tuple[str, str]) -> sql.Identifier:
    """A table of the user's, guarded by ``KEY``'s lease."""
    for statement in init_statements(lock_table, fencing=True):
        db.execute(statement)
    db.execute(guard_sql(lock_table))
    table = (lock_table[0], "report")
    db.execute(sql.SQL("CREATE TABLE {} (body text)").format(sql.Identifier(*table)))
    for statement in fence_statements(lock_table, table, KEY):
        db.execute(statement)
    return sql.Identifier(*table)


@pytest.fixture
def context(database_url: str, lock_table: tuple[str, str]) -> LockContext:
    return LockContext(
        url=database_url,
        table_parts=list(lock_table),
        lock_key=KEY,
        owner="holder",
        fencing=True,
        run_ttl_seconds=30.0,
        lease_interval_seconds=5.0,
    )


@pytest.fixture
def write(database_url: str, report: sql.Identifier) -> Write:
    def write(token: int | None = None) -> str | None:
        """One row in a transaction of its own carrying ``token``: None when it
        committed, else the refusal (SQLSTATE and first line)."""
        with psycopg.connect(database_url, autocommit=True, prepare_threshold=None) as conn:
            try:
                with conn.transaction():
                    if token is not None:
                        set_fencing_token(conn, token)
                    conn.execute(sql.SQL("INSERT INTO {} VALUES ('x')").format(report))
            except psycopg.Error as exc:
                return f"{exc.sqlstate}: {str(exc).splitlines()[0]}"
        return None

    return write


def test_the_token_is_set_for_one_transaction_only(
    database_url: str, report: sql.Identifier, context: LockContext
) -> None:
    insert = sql.SQL("INSERT INTO {} VALUES ('x')").format(report)
    with LeaseLock(context) as lock, psycopg.connect(database_url, prepare_threshold=None) as conn:
        assert lock.fence is not None
        set_fencing_token(conn, lock.fence)  # opens the transaction it is local to
        conn.execute(insert)
        conn.commit()
        conn.execute(insert)
        with pytest.raises(psycopg.Error, match="carries no fencing token") as refused:
            conn.commit()
        assert refused.value.sqlstate == "FENCE"
        conn.rollback()
        conn.autocommit = True
        with pytest.raises(ConfigurationError, match="no transaction is open"):
            set_fencing_token(conn, lock.fence)
        with pytest.raises(ConfigurationError, match="is not a token"):
            set_fencing_token(conn, "1; DROP TABLE x")


def test_asyncio_sets_the_token_too(
    database_url: str, report: sql.Identifier, context: LockContext
) -> None:
    async def main() -> None:
        async with dislock.aio.LeaseLock(context) as lock:
            assert lock.fence is not None
            conn = await psycopg.AsyncConnection.connect(
                database_url, autocommit=True, prepare_threshold=None
            )
            async with conn:
                async with conn.transaction():
                    await dislock.aio.set_fencing_token(conn, lock.fence)
                    await conn.execute(sql.SQL("INSERT INTO {} VALUES ('aio')").format(report))
                with pytest.raises(psycopg.Error, match="carries no fencing token"):
                    await conn.execute(sql.SQL("INSERT INTO {} VALUES ('x')").format(report))

    asyncio.run(main())


def test_a_stale_token_is_refused_and_a_marked_lease_is_not_live(
    write: Write, context: LockContext, db: psycopg.Connection[Any], lock_table: tuple[str, str]
) -> None:
    with LeaseLock(context) as first:
        assert first.fence is not None and write(first.fence) is None
    with LeaseLock(dataclasses.replace(context, owner="second")) as second:
        assert second.fence == first.fence + 1
        assert write(second.fence) is None
        stale = write(first.fence)
        assert stale is not None and "is not that of a live lease of lock 'nightly'" in stale
        # A replacer's mark ends the lease for writes at once, though the row is live.
        db.execute(
            sql.SQL("UPDATE {} SET value = value || ' (replaced by other)' WHERE key = %s").format(
                sql.Identifier(*lock_table)
            ),
            (lease_key(KEY),),
        )
        assert write(second.fence) is not None


def test_any_live_slot_holders_token_is_accepted(write: Write, context: LockContext) -> None:
    slots = dataclasses.replace(context, slots=2)
    with LeaseLock(slots) as one, LeaseLock(dataclasses.replace(slots, owner="two")) as two:
        assert one.fence is not None and two.fence is not None
        assert write(one.fence) is None
        assert write(two.fence) is None
    assert write(two.fence) is not None


def test_a_takeover_before_the_commit_fails_the_commit(
    database_url: str,
    report: sql.Identifier,
    context: LockContext,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
) -> None:
    table = sql.Identifier(*lock_table)
    live = sql.SQL(
        "INSERT INTO {} (key, value, expire_at, fence)"
        " VALUES (%s, 'old', NOW() + interval '1 h', 7)"
    )
    db.execute(live.format(table), (lease_key(KEY),))
    with psycopg.connect(database_url, prepare_threshold=None) as writer:
        set_fencing_token(writer, 7)
        writer.execute(sql.SQL("INSERT INTO {} VALUES ('late')").format(report))
        # The holder froze: its lease ran out, and another machine took it over.
        expire = sql.SQL("UPDATE {} SET expire_at = NOW() WHERE key = %s")
        db.execute(expire.format(table), (lease_key(KEY),))
        assert _take(context) == 8
        with pytest.raises(psycopg.Error, match="fencing token 7 is not that of a live lease"):
            writer.commit()
    assert db.execute(sql.SQL("SELECT count(*) FROM {}").format(report)).fetchone() == (0,)


def test_the_commits_check_holds_no_lock_on_the_lease(
    database_url: str,
    report: sql.Identifier,
    context: LockContext,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
) -> None:
    """A lock held from the check to the transaction's end would let any transaction
    left open hold up the lease's renewal and takeover (#61): the check holds none, so
    a takeover between it and the commit's end is not seen (docs/fencing.md)."""
    table = sql.Identifier(*lock_table)
    with psycopg.connect(database_url, prepare_threshold=None) as writer:
        token = _checked_while_live(writer, db, table, report)
        with psycopg.connect(database_url, autocommit=True) as holder:
            holder.execute("SET lock_timeout = '20s'")  # it must not wait at all
            ended = holder.execute(
                sql.SQL("UPDATE {} SET expire_at = clock_timestamp() WHERE key = %s").format(table),
                (lease_key(KEY),),
            )
            assert ended.rowcount == 1
        assert _take(context) == token + 1
        writer.commit()
    assert db.execute(sql.SQL("SELECT body FROM {}").format(report)).fetchall() == [("in time",)]


def _take(context: LockContext) -> int | None:
    with LeaseLock(dataclasses.replace(context, owner="new")) as new:
        return new.fence


def _checked_while_live(
    writer: psycopg.Connection[Any],
    db: psycopg.Connection[Any],
    table: sql.Identifier,
    report: sql.Identifier,
) -> int:
    """A lease row that ends soon, a write carrying its token, and the guard's check
    run at once (``SET CONSTRAINTS … IMMEDIATE``, as a commit runs it): its token.  A
    machine slow enough to miss the lease's end tries again with a longer one."""
    for seconds in (2, 8, 32):
        row = db.execute(
            sql.SQL(
                "INSERT INTO {} AS held (key, value, expire_at, fence) VALUES"
                " (%(key)s, 'old', clock_timestamp() + make_interval(secs => %(s)s), 1)"
                " ON CONFLICT (key) DO UPDATE SET value = 'old', fence = held.fence + 1,"
                " expire_at = EXCLUDED.expire_at RETURNING fence"
            ).format(table),
            {"key": lease_key(KEY), "s": seconds},
        ).fetchone()
        assert row is not None
        set_fencing_token(writer, row[0])
        writer.execute(sql.SQL("INSERT INTO {} VALUES ('in time')").format(report))
        try:
            writer.execute("SET CONSTRAINTS ALL IMMEDIATE")
            return int(row[0])
        except psycopg.Error:
            writer.rollback()
    raise AssertionError("the guard never found a lease live 32 s after it was written")


HOLDER = """
import sys, time
from pathlib import Path
import psycopg
from dislock import LeaseLock, LockContext, LeaseLostError, set_fencing_token

url, schema, workdir = sys.argv[1:4]
work = Path(workdir)
context = LockContext(url=url, table_parts=[schema, "key_value"], lock_key="nightly",
                      owner="paused-holder", run_ttl_seconds=1.0, lease_interval_seconds=0.2,
                      fencing=True)
try:
    with LeaseLock(context) as lock:
        # Written whole, then renamed: the test reads the token once the file appears,
        # and may freeze this process between a write's open and its data.
        (work / "started.part").write_text(str(lock.fence))
        (work / "started.part").rename(work / "started")
        while not (work / "go").exists():
            time.sleep(0.01)
        with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
            try:
                with conn.transaction():
                    set_fencing_token(conn, lock.fence)
                    conn.execute('INSERT INTO "' + schema + '".report VALUES (%s)', ("stale",))
                (work / "result").write_text("accepted")
            except psycopg.Error as exc:
                (work / "result").write_text(exc.sqlstate or "")
except LeaseLostError:
    sys.exit(75)
"""


def test_a_frozen_holder_woken_after_a_takeover_cannot_write(
    database_url: str,
    report: sql.Identifier,
    context: LockContext,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    tmp_path: Path,
) -> None:
    """No fence column, no condition in the write: the guard alone refuses it."""
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLDER), database_url, lock_table[0], str(tmp_path)]
    )
    try:
        wait_for(tmp_path / "started", timeout=60)
        os.kill(holder.pid, signal.SIGSTOP)  # frozen: no renewals, no writes
        expired = sql.SQL("SELECT expire_at <= NOW() FROM {} WHERE key = %s").format(
            sql.Identifier(*lock_table)
        )
        eventually(
            lambda: db.execute(expired, (lease_key(KEY),)).fetchone() == (True,),
            timeout=60,
            message="the frozen holder's lease did not run out",
        )
        with LeaseLock(dataclasses.replace(context, owner="new")) as new:
            assert new.fence == int((tmp_path / "started").read_text()) + 1
            (tmp_path / "go").touch()
            os.kill(holder.pid, signal.SIGCONT)  # wakes up believing it holds the lock
            holder.wait(timeout=60)
            assert (tmp_path / "result").read_text() == "FENCE"
    finally:
        if holder.poll() is None:  # never leave it stopped
            os.kill(holder.pid, signal.SIGCONT)
            holder.kill()
            holder.wait()
    assert db.execute(sql.SQL("SELECT body FROM {}").format(report)).fetchall() == []
