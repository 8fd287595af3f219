"""Connection patience: which refusals are waited out, and the backoff between tries."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg.errors import ObjectNotInPrerequisiteState, ReadOnlySqlTransaction

from dislock import LockContext
from dislock.core.errors import ConfigurationError, DatabaseUnreachableError, NotReplicatedError
from dislock.core.patience import (
    BACKOFF_CAP,
    BACKOFF_FIRST,
    FIRST_ATTEMPT_TIMEOUT,
    ConnectPatience,
    SlotEnd,
    backoff_delay,
    is_transient,
    passing_answer,
    slot_patience,
)
from dislock.core.variables import CONNECT_PATIENCE


class Refusal(Exception):
    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    "message",
    [
        'connection failed: ... failed: FATAL:  too many connections for role "app"',
        'connection failed: ... failed: FATAL:  too many connections for database "db"',
        "connection failed: ... failed: FATAL:  sorry, too many clients already",
        "FATAL:  remaining connection slots are reserved for roles with the SUPERUSER attribute",
        "FATAL:  no more connections allowed (max_client_conn)",
        "FATAL:  the database system is starting up",
        "FATAL:  the database system is shutting down",
        "FATAL:  the database system is in recovery mode",
        "FATAL:  the database system is not yet accepting connections",
        'connection to server at "10.0.0.1", port 5432 failed: Connection refused',
        "server closed the connection unexpectedly",
        "could not receive data from server: Connection reset by peer",
        'connection to server on socket "/run/postgresql/.s.PGSQL.5432" failed: '
        "No such file or directory",
        # a full listen queue: a herd faster than the postmaster accepts
        'connection is bad: connection to server on socket "/tmp/pg/.s.PGSQL.5432" failed: '
        "Resource temporarily unavailable",
        # a frozen or partitioned host, and a failover in progress
        "connection timeout expired",
        'connection to server at "10.0.0.1", port 5432 failed: timeout expired',
        'connection to server at "10.0.0.2", port 5432 failed: session is read-only',
        'connection to server at "10.0.0.2", port 5432 failed: server is in hot standby mode',
        "connection timeout expired\nMultiple connection attempts failed. All failures were:\n"
        "- host: 'a', port: '5432', hostaddr: '10.0.0.1': connection timeout expired\n"
        "- host: 'b', port: '5432', hostaddr: '10.0.0.2': connection failed: connection to"
        ' server at "10.0.0.2", port 5432 failed: session is read-only',
    ],
)
def test_refusals_of_a_busy_or_restarting_server_are_transient(message: str) -> None:
    assert is_transient(Refusal(message))


@pytest.mark.parametrize(
    "message",
    [
        'FATAL:  password authentication failed for user "app"',
        'FATAL:  database "nope" does not exist',
        'FATAL:  role "nope" does not exist',
        'FATAL:  no pg_hba.conf entry for host "10.0.0.2"',
        'could not translate host name "db.invalid" to address: Name or service not known',
        # a permanent refusal beside a transient one (several hosts): reported
        "host a: Connection refused; host b: FATAL: password authentication failed",
    ],
)
def test_permanent_failures_are_not_retried(message: str) -> None:
    assert not is_transient(Refusal(message))


def test_a_sqlstate_decides_when_there_is_one() -> None:
    assert is_transient(Refusal("anything", sqlstate="53300"))
    assert is_transient(Refusal("anything", sqlstate="57P03"))
    assert not is_transient(Refusal("too many connections", sqlstate="28P01"))
    assert not is_transient(Refusal("cannot execute in a read-only transaction", "25006"))


def test_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    rng = random.Random(7)
    for attempt in range(12):
        bound = min(BACKOFF_CAP, BACKOFF_FIRST * 2**attempt)
        delays = [backoff_delay(attempt, rng) for _ in range(200)]
        assert all(bound / 2 <= delay <= bound for delay in delays)
        assert max(delays) - min(delays) > bound / 4  # jittered, so the herd spreads
    assert backoff_delay(10_000, rng) <= BACKOFF_CAP


def test_patience_ends_at_its_deadline_and_the_last_pause_reaches_it() -> None:
    refusal = Refusal("too many clients already")
    state = ConnectPatience(1.0, now=100.0, rng=random.Random(1))
    now, pauses = 100.0, []
    while (delay := state.next_delay(refusal, now)) is not None:
        pauses.append(delay)
        now += delay
    assert now == pytest.approx(101.0)
    assert pauses[0] <= BACKOFF_FIRST
    assert state.next_delay(refusal, 101.0) is None
    assert (
        ConnectPatience(10, now=0).next_delay(Refusal("password authentication failed"), 0) is None
    )
    assert ConnectPatience(0, now=0).next_delay(refusal, 0) is None


def test_a_schedule_slot_bounds_the_patience() -> None:
    now = datetime(2026, 1, 1, 12, 0, 50, tzinfo=timezone.utc)
    assert slot_patience(30, None, now) == 30
    assert slot_patience(30, now + timedelta(seconds=10), now) == 10
    assert slot_patience(30, now + timedelta(minutes=5), now) == 30
    assert slot_patience(30, now - timedelta(seconds=1), now) == 0


def test_every_connection_of_an_acquisition_shares_one_deadline() -> None:
    refusal = Refusal("too many clients already")
    state = ConnectPatience(10.0, now=0.0, rng=random.Random(2))
    assert state.next_delay(refusal, 1.0) is not None  # the first connection, refused
    # Connected at 2 s; its link retired, the reopening is refused at 9 s, then at 10 s.
    assert state.next_delay(refusal, 9.0) is not None
    assert state.next_delay(refusal, 10.0) is None
    assert state.deadline(10.0) == 10.0


def test_the_slot_end_is_read_at_the_first_failure_and_bounds_the_deadline() -> None:
    wall = datetime(2026, 1, 1, 12, 0, 50, tzinfo=timezone.utc)
    asked: list[int] = []

    def slot() -> SlotEnd:
        asked.append(1)
        return SlotEnd("job", wall + timedelta(seconds=4), wall)

    state = ConnectPatience(30.0, now=100.0, slot=slot)
    assert state.attempt_timeout(10.0, 1, 100.0) == FIRST_ATTEMPT_TIMEOUT
    assert asked == []  # a first try that succeeds computes no slot
    assert state.next_delay(Refusal("timeout expired"), 103.0, attempt_started=101.0) is not None
    assert state.deadline(103.0) == pytest.approx(107.0)  # 4 s after the slot was read
    assert state.next_delay(Refusal("timeout expired"), 107.0) is None
    error = state.unreachable(Refusal("connection timeout expired"), "timeout expired", 107.0)
    assert isinstance(error, DatabaseUnreachableError)
    assert error.slot_end == wall + timedelta(seconds=4) and error.lock_key == "job"
    assert error.unreachable_for == pytest.approx(6.0) and error.attempts == 2
    assert str(error) == (
        "the schedule slot of 'job' ending 2026-01-01T12:00:54+00:00 ended while the"
        " database was unreachable (6.0 s, 2 attempts): timeout expired"
    )
    state.postpone(30.0)  # a slot's end does not move
    assert state.deadline(200.0) == pytest.approx(107.0)
    assert len(asked) == 1


def test_the_patience_running_out_is_reported_with_how_long_it_lasted() -> None:
    state = ConnectPatience(3.0, now=0.0)
    refusal = Refusal("too many connections for role")
    assert state.next_delay(refusal, 0.5, attempt_started=0.0) is not None
    assert state.next_delay(refusal, 3.0) is None
    error = state.unreachable(refusal, "too many connections", 3.0)
    assert error is not None and error.slot_end is None
    assert str(error) == (
        "the database was unreachable for 3.0 s (2 attempts; connect_patience_seconds=3):"
        " too many connections"
    )
    permanent = Refusal("password authentication failed")
    assert ConnectPatience(3.0, now=0.0).unreachable(permanent, "x", 0.0) is None


READ_ONLY = ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction")


@pytest.mark.parametrize(
    ("error", "passing"),
    [
        (READ_ONLY, True),  # a standby, a demoting primary, a read-only session
        (ObjectNotInPrerequisiteState("recovery is in progress"), True),  # a standby's WAL
        (NotReplicatedError("lease 'x' was not acquired (handed back): ..."), True),
        (ObjectNotInPrerequisiteState("lock table is not ready"), False),
        (psycopg.errors.InsufficientPrivilege("permission denied for table locks"), False),
        (psycopg.errors.UndefinedTable('relation "locks" does not exist'), False),
        # A refused connection is the connection's patience (is_transient), not an answer.
        (psycopg.OperationalError("connection refused"), False),
        (
            DatabaseUnreachableError(
                "unreachable", detail="x", unreachable_for=1.0, attempts=2, patience=1.0
            ),
            False,
        ),
    ],
    ids=str,
)
def test_a_failovers_passing_answers(error: Exception, passing: bool) -> None:
    assert passing_answer(error) is passing


def test_a_passing_answer_is_retried_within_the_patience_then_says_how_long() -> None:
    state = ConnectPatience(3.0, now=0.0)
    assert state.next_delay(READ_ONLY, 0.5, attempt_started=0.0) is not None
    assert state.next_delay(READ_ONLY, 3.0) is None
    error = state.still_answered(READ_ONLY, 3.0)
    # Its own kind (so the same advice and exit), saying how long it was tried.
    assert isinstance(error, ReadOnlySqlTransaction) and error.sqlstate == "25006"
    assert str(error) == (
        "cannot execute INSERT in a read-only transaction (answered so for 3.0 s,"
        " 2 attempts, within a connect patience of 3 s)"
    )
    unconfirmed = NotReplicatedError("lease 'x' was not acquired (handed back)")
    ends = datetime(2026, 12, 3, 12, 1, tzinfo=timezone.utc)
    state = ConnectPatience(3.0, now=0.0, slot=lambda: SlotEnd("x", ends, ends))
    assert state.next_delay(unconfirmed, 0.5, attempt_started=0.0) is None  # the slot ended
    error = state.still_answered(unconfirmed, 0.5)
    assert isinstance(error, NotReplicatedError)
    assert str(error).endswith("(answered so for 0.5 s, 1 attempt, until the schedule slot ended)")


def test_without_patience_a_passing_answer_is_reported_as_it_came() -> None:
    state = ConnectPatience(0.0, now=0.0)
    assert state.next_delay(READ_ONLY, 0.0, attempt_started=0.0) is None
    assert state.still_answered(READ_ONLY, 0.0) is READ_ONLY


def test_waiting_for_the_holder_does_not_spend_the_patience() -> None:
    refusal = Refusal("too many clients already")
    state = ConnectPatience(5.0, now=0.0)
    state.postpone(100.0)  # a lease waited 100 s for its holder
    assert state.next_delay(refusal, 104.0) is not None
    state.postpone(10.0)  # and then 10 s more: the deadline had been fixed, it moves too
    assert state.deadline(114.0) == pytest.approx(115.0)


def test_each_try_gives_every_host_a_short_growing_timeout_within_the_patience() -> None:
    timeout = Refusal("connection timeout expired")
    state = ConnectPatience(120.0, now=0.0, rng=random.Random(3))
    assert state.attempt_timeout(10.0, 2, 0.0) == FIRST_ATTEMPT_TIMEOUT
    now, seen = 0.0, []
    for _ in range(5):
        seen.append(state.attempt_timeout(10.0, 2, now))
        now += 2 * seen[-1]
        delay = state.next_delay(timeout, now)
        assert delay is not None
        now += delay
    assert seen == [2.0, 4.0, 8.0, 10.0, 10.0]  # doubling up to the connect timeout
    # Near the deadline the time left is shared among the hosts, down to libpq's floor.
    assert state.attempt_timeout(10.0, 2, 112.0) == 4.0
    assert state.attempt_timeout(10.0, 2, 119.0) == FIRST_ATTEMPT_TIMEOUT
    assert state.attempt_timeout(1.0, 2, 119.0) == 1.0  # a shorter configured timeout stays
    # Without patience, the first try is the only one: it gets the whole timeout.
    assert ConnectPatience(0.0, now=0.0).attempt_timeout(10.0, 2, 0.0) == 10.0


def test_lock_context_validates_the_patience() -> None:
    fields: dict[str, Any] = {
        "url": "postgresql://h/db",
        "table_parts": ["t"],
        "lock_key": "k",
        "owner": "o",
    }
    assert LockContext(**fields).connect_patience_seconds == CONNECT_PATIENCE.value
    assert LockContext(**fields, connect_patience_seconds=0).connect_patience_seconds == 0
    bad: Any
    for bad in (-1, float("nan"), "soon", True):
        with pytest.raises(ConfigurationError, match="connect_patience_seconds"):
            LockContext(**fields, connect_patience_seconds=bad)
