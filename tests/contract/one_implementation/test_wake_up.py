"""What wakes a waiter (``LISTEN``/``NOTIFY``), through the sync API and the statements
themselves: the wake payload is the server's, however the table is named, and a
hand-back wakes as a release does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock import LockContext
from dislock.cli.sending import send
from dislock.core.waiting import wake_key

MakeContext = Callable[..., LockContext]
LEASE = {"run_ttl_seconds": 3.0, "lease_interval_seconds": 0.5}


def waiting_for_a_release(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once a sync waiter has been refused and listens for a release: from
    then on only a ``NOTIFY`` (or its next poll, far away) lets it go on."""
    from dislock._sync._listen import Listener

    refused = threading.Event()
    original = Listener.wait

    def wait(self: Listener, timeout: float) -> bool:
        refused.set()
        return original(self, timeout)

    monkeypatch.setattr(Listener, "wait", wait)
    return refused


@pytest.mark.direct_postgres
def test_a_release_wakes_a_waiter_that_names_the_table_another_way(
    make_context: MakeContext,
    lock_table: tuple[str, str],
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The holder names ``schema.key_value``; the waiter ``key_value`` through its
    search path. The wake payload is the server's (table oid, key digest), so the
    release still wakes the waiter long before its next poll."""
    from psycopg.conninfo import make_conninfo

    from dislock import LeaseLock, acquire_locks

    refused = waiting_for_a_release(monkeypatch)
    schema, table = lock_table
    holder = LeaseLock(make_context(**LEASE))
    unqualified = make_context(
        **LEASE,
        url=make_conninfo(database_url, options=f"-c search_path={schema}"),
        table_parts=[table],
        wait_seconds=60,
        wait_poll_seconds=30,  # polls 15 to 45 s apart: only the NOTIFY is quick
    )

    def wait_then_take() -> float:
        with acquire_locks(unqualified, ["lease"]):
            return time.monotonic()

    with ThreadPoolExecutor(1) as pool:
        holder.__enter__()
        try:
            waiter = pool.submit(wait_then_take)
            assert refused.wait(60), "the waiter never began to wait for a release"
            assert not waiter.done()
        finally:
            released = time.monotonic()
            holder.__exit__(None, None, None)
        assert waiter.result(timeout=60) - released < 10.0


@pytest.mark.direct_postgres
def test_handing_back_the_slots_of_an_acquisition_wakes_the_leases_waiters(
    db: psycopg.Connection[Any], lock_table: tuple[str, str], database_url: str
) -> None:
    """The statement that hands back whichever slot an interrupted or unconfirmed
    acquisition may have taken wakes waiters as a holder's own release does, and
    only when it released a row of ours."""
    from dislock.core.lock_statements import statements as lock_statements
    from dislock.core.waiting import WAKE_CHANNEL, listen_query, slot_keys

    statements = lock_statements(lock_table)
    keys = slot_keys("job", 3)
    with psycopg.connect(database_url, autocommit=True) as waiter:
        row = waiter.execute(listen_query(lock_table), {"wake_key": wake_key("job")}).fetchone()
        assert row is not None
        expected = row[1]
        waiter.execute(sql.SQL("LISTEN {}").format(sql.Identifier(WAKE_CHANNEL)))

        def woken() -> list[str]:
            return [n.payload for n in waiter.notifies(timeout=0.5) if n.channel == WAKE_CHANNEL]

        assert send(db, statements.acquire_slot(keys, "me", 60.0)).key == keys[0]
        send(db, statements.acquire_slot(keys, "other", 60.0))

        hand_back = statements.hand_back(keys, "me", "job")
        assert send(db, hand_back)
        assert woken() == [expected]
        assert not send(db, hand_back)  # nothing of ours is left: no wake-up
        assert woken() == []
    held = db.execute(
        sql.SQL("SELECT key, value FROM {} WHERE key = ANY(%s) AND expire_at > NOW()").format(
            sql.Identifier(*lock_table)
        ),
        (keys,),
    ).fetchall()
    assert held == [(keys[1], "other")]
