"""Connection patience: which refusals are waited out, and the backoff between tries."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from dislock import LockContext
from dislock.core.errors import ConfigurationError
from dislock.core.patience import (
    BACKOFF_CAP,
    BACKOFF_FIRST,
    DEFAULT_CONNECT_PATIENCE,
    ConnectPatience,
    backoff_delay,
    is_transient,
    slot_patience,
)


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
        "connection timeout expired",
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


def test_lock_context_validates_the_patience() -> None:
    fields: dict[str, Any] = {
        "url": "postgresql://h/db",
        "table_parts": ["t"],
        "lock_key": "k",
        "owner": "o",
    }
    assert LockContext(**fields).connect_patience_seconds == DEFAULT_CONNECT_PATIENCE
    assert LockContext(**fields, connect_patience_seconds=0).connect_patience_seconds == 0
    bad: Any
    for bad in (-1, float("nan"), "soon", True):
        with pytest.raises(ConfigurationError, match="connect_patience_seconds"):
            LockContext(**fields, connect_patience_seconds=bad)
