"""What wakes a waiter (``LISTEN``/``NOTIFY``), through the sync API and the statements
themselves: the wake payload is the server's, however the table is named, a
hand-back wakes as a release does, and a flood of ``NOTIFY``s that released
nothing costs a waiter a few reads by primary key."""

from __future__ import annotations

import itertools
import re
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock import LockContext
from dislock.cli.sending import send
from dislock.core.rows import lease_key
from dislock.core.waiting import WAKE_CHANNEL, WAKE_SPACING, listen
from tests.support.eventually import eventually
from tests.support.rows import Rows

MakeContext = Callable[..., LockContext]
LEASE = {"run_ttl_seconds": 3.0, "lease_interval_seconds": 0.5}


def waiting_for_a_release(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once a sync waiter has been refused and listens for a release: from
    then on only a ``NOTIFY`` (or its next poll, far away) lets it go on."""
    from dislock._sync._waiting import Listener

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
    from dislock.core.waiting import WAKE_CHANNEL, slot_keys

    statements = lock_statements(lock_table)
    keys = slot_keys("job", 3)
    with psycopg.connect(database_url, autocommit=True) as waiter:
        expected = send(waiter, listen(lock_table, "job")).wake
        oid = expected.split(":")[0]

        def anothers(payload: str) -> bool:
            """A wake-up of another table's lease: every release on the server is
            heard on this channel, another xdist worker's too.  Anything else (ours,
            or not a wake payload at all) is counted."""
            return re.fullmatch(r"[0-9]+:[0-9a-f]{64}", payload) is not None and (
                payload.split(":")[0] != oid
            )

        waiter.execute(sql.SQL("LISTEN {}").format(sql.Identifier(WAKE_CHANNEL)))

        def woken() -> list[str]:
            return [
                n.payload
                for n in waiter.notifies(timeout=0.5)
                if n.channel == WAKE_CHANNEL and not anothers(n.payload)
            ]

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


def _scans(db: psycopg.Connection[Any], table: tuple[str, str]) -> int:
    """Sequential and index scans of ``table`` so far, as the server counts them."""
    found = db.execute(
        "SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_user_tables"
        " WHERE relid = %s::regclass",
        (sql.Identifier(*table).as_string(db),),
    ).fetchone()
    assert found is not None
    return int(found[0])


@pytest.mark.direct_postgres
def test_a_flood_of_notifies_costs_a_waiter_a_few_reads(
    make_context: MakeContext,
    lock_table: tuple[str, str],
    database_url: str,
    db: psycopg.Connection[Any],
    rows: Rows,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Any role may ``NOTIFY`` with the payload a release sends (a security review's
    reader role sent 400; the waiter's scans of the table went from 293 to 2,088
    per 10 s).  Those wake-ups are taken together, and each read of them is one
    read by primary key: the waiter never sends the acquiring statement while the
    lease's row is live, however many arrive."""
    from psycopg.conninfo import make_conninfo

    import dislock._sync._waiting as waiting_module
    from dislock import acquire_locks

    tried: list[float] = []
    read: list[float] = []
    wait_for_release = waiting_module.wait_for_release
    still_held = waiting_module._still_held

    def counting_tries(context: LockContext, attempt: Any, patience: Any) -> Any:
        def counted() -> Any:
            tried.append(time.monotonic())
            return attempt()

        return wait_for_release(context, counted, patience)

    def counting_reads(*args: Any) -> bool:
        read.append(time.monotonic())
        return still_held(*args)

    # The lease imports it when it first waits: patched where it is defined.
    monkeypatch.setattr(waiting_module, "wait_for_release", counting_tries)
    monkeypatch.setattr(waiting_module, "_still_held", counting_reads)
    refused = waiting_for_a_release(monkeypatch)
    name = f"flooded-{uuid.uuid4().hex[:8]}"  # the waiter's connections, to see them end
    context = make_context(
        **LEASE,
        url=make_conninfo(database_url, application_name=name),
        wait_seconds=120,
        wait_poll_seconds=30,  # polls 15 to 45 s apart: the flood is what wakes it
    )
    key = lease_key(context.lock_key)
    rows.plant(key, "holder", 3600)  # held, by nobody that renews or releases it
    payload = send(db, listen(lock_table, context.lock_key)).wake
    before = _scans(db, lock_table)

    def wait_then_take() -> None:
        with acquire_locks(context, ["lease"]):
            pass

    with ThreadPoolExecutor(1) as pool:
        waiter = pool.submit(wait_then_take)
        assert refused.wait(60), "the waiter never began to wait for a release"
        waiting_since = time.monotonic()
        flood_began = time.monotonic()
        for _ in range(400):  # each its own transaction: none is folded into another
            db.execute("SELECT pg_notify(%s, %s)", (WAKE_CHANNEL, payload))
        # Then a real release.
        rows.expire(key)
        db.execute("SELECT pg_notify(%s, %s)", (WAKE_CHANNEL, payload))
        waiter.result(timeout=60)
        waiter_ended = time.monotonic()
        waited = waiter_ended - waiting_since

    # Tries: the first (refused), and the one after the release; a poll only if
    # this machine took 15 s or more.
    assert len(tried) <= 2 + int(waited // 15), (len(tried), waited)
    # Reads: at most one per WAKE_SPACING from the flood's start until the waiter
    # was done (its NOTIFYs arrive a little after they are sent), whatever their
    # number.  (Before, each wake-up cost a try: 118 of them.)
    span = waiter_ended - flood_began
    assert len(read) <= 2 + int(span / WAKE_SPACING) < 400, (len(read), span)
    assert all(later - earlier >= WAKE_SPACING for earlier, later in itertools.pairwise(read))
    # The server's count, once the waiter's connections have ended (a backend
    # reports its counts at the latest when it exits): the tries and releases' few
    # scans each, and one per read.  (Before: 590 scans for this flood.)
    eventually(
        lambda: (
            db.execute(
                "SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone()
            == (True,)
        ),
        message="the waiter's connections did not end",
    )
    scans = _scans(db, lock_table) - before
    assert scans <= 10 * len(tried) + len(read) + 10, (scans, len(tried), len(read))
