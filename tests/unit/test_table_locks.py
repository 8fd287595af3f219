"""How ``grant``, ``revoke`` and ``init`` try for a table in use (``dislock.core.table_locks``):
when they try again, when they give up, and the line that names who held the table."""

from __future__ import annotations

import random

from dislock.core.table_locks import Holder, Tries, busy, holders


def test_tries_pause_briefly_then_longer_and_stop_at_the_deadline() -> None:
    tries = Tries(5.0, now=100.0, rng=random.Random(7))
    now, pauses = 100.0, []
    while (delay := tries.next_delay(now)) is not None:
        pauses.append(delay)
        now += delay + 0.1  # each try waits for its lock for LOCK_WAIT_MS
    assert pauses[0] <= 0.05 and max(pauses) <= 2.0
    assert pauses == sorted(pauses[:4]) + pauses[4:]  # growing at first
    assert now >= 105.0 and now - 0.1 - pauses[-1] < 105.0  # the last try is at the deadline


def test_no_patience_means_one_try() -> None:
    assert Tries(0.0, now=1.0).next_delay(1.0) is None


def test_the_line_names_the_holder_and_how_to_end_it() -> None:
    found = [
        Holder(4242, "billing", "psql", "AccessShareLock", 41.6),
        Holder(4243, "other\x1b[31m", "", "RowExclusiveLock", None),
    ]
    line = busy("revoke", ("ops", "locks"), found, 30.0)
    assert line == (
        "revoke gave up after 30 s: ops.locks stayed locked by others:"
        " role 'billing' (pid 4242, 'psql', AccessShareLock, in a transaction open 42 s);"
        " role 'other\\x1b[31m' (pid 4243, RowExclusiveLock); end that transaction"
        " (or SELECT pg_terminate_backend(4242)) and run it again"
    )
    assert "\n" not in line


def test_nobody_left_holding_says_to_run_again() -> None:
    assert busy("grant", ("locks",), [], 3.0).endswith("(no session holds it now: run it again)")


def test_a_session_with_several_locks_is_named_once() -> None:
    exchange = holders([("ops", "locks"), ("ops", "locks_history")])
    assert exchange.params == {"tables": ['"ops"."locks"', '"ops"."locks_history"']}
    rows = [(7, "a", "psql", "AccessShareLock", 3.0), (7, "a", "psql", "RowShareLock", 3.0)]
    assert exchange.read(rows) == [Holder(7, "a", "psql", "AccessShareLock", 3.0)]


def test_a_prepared_transaction_is_named_as_one() -> None:
    exchange = holders([("locks",)])
    rows = [(None, "", "", "AccessShareLock", None), (8, "b", "", "RowShareLock", 2.0)]
    found = exchange.read(rows)
    assert [holder.pid for holder in found] == [None, 8]
    line = busy("revoke", ("locks",), found, 3.0)
    assert "a prepared transaction (AccessShareLock: COMMIT PREPARED or ROLLBACK PREPARED" in line
    assert line.endswith("(or SELECT pg_terminate_backend(8)) and run it again")
    assert busy("revoke", ("locks",), found[:1], 3.0).endswith(
        "end that transaction and run it again"
    )
