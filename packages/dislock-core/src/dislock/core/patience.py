"""Connection patience: which refusals to wait out, and how long to wait between tries.

Every machine's crontab fires in the same second, and a busy server refuses
connections past a limit (``max_connections``, a role's or database's
``CONNECTION LIMIT``, a pooler's cap) or while it restarts.  Those refusals say
nothing about the lock, so a wrapper that gave up on them would fail (and mail)
for nothing: they are retried, with jittered exponential backoff so that the
herd spreads out, for at most ``connect_patience_seconds`` and, for a schedule
lock, never past the end of the slot being taken.  Everything else (a wrong
password, a missing database) is reported at once.

Only *opening* a connection is retried: a statement that failed mid-way may
have taken effect, and its outcome is the lock code's to judge.
"""

from __future__ import annotations

import random
from datetime import datetime

DEFAULT_CONNECT_PATIENCE = 30.0
"""Seconds a lock keeps retrying a refused connection before reporting it."""

BACKOFF_FIRST = 0.05
"""Upper bound of the first pause between two connection attempts, in seconds."""

BACKOFF_CAP = 2.0
"""The pauses double up to this bound, so that a freed slot is found soon."""

TRANSIENT_SQLSTATES = frozenset({"53300", "57P03"})
"""too_many_connections (every variant) and cannot_connect_now."""

# libpq reports a refused start-up without a SQLSTATE (there is no result to
# carry one), so the server's words are matched too: the English messages of
# 53300 and 57P03, and the operating system's words for a server that is
# restarting (its port closed, its socket file gone, the connection dropped).
_TRANSIENT_WORDS = (
    "too many connections",  # for role "...", for database "..."
    "too many clients already",  # max_connections
    "remaining connection slots are reserved",  # superuser/reserved slots
    "no more connections allowed",  # PgBouncer's max_client_conn
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "the database system is not accepting connections",
    "connection refused",
    "connection reset by peer",
    "server closed the connection unexpectedly",
    "no such file or directory",  # a Unix socket between two server lives
)
# Words that make a refusal permanent even beside a transient one (a URL with
# several hosts reports each attempt).
_PERMANENT_WORDS = (
    "authentication failed",
    "does not exist",
    "no pg_hba.conf entry",
    "permission denied",
)


def is_transient(error: BaseException) -> bool:
    """Whether a failure to connect is worth retrying (see the module's docstring)."""
    sqlstate = getattr(error, "sqlstate", None)
    if sqlstate is not None:
        return sqlstate in TRANSIENT_SQLSTATES
    text = " ".join(str(error).split()).lower()
    if any(word in text for word in _PERMANENT_WORDS):
        return False
    return any(word in text for word in _TRANSIENT_WORDS)


def backoff_delay(attempt: int, rng: random.Random | None = None) -> float:
    """The pause after failed attempt number ``attempt`` (from 0): uniform between
    half and all of ``BACKOFF_FIRST * 2**attempt``, capped at ``BACKOFF_CAP``."""
    bound = min(BACKOFF_CAP, BACKOFF_FIRST * 2.0 ** min(attempt, 32))
    return (rng or random).uniform(bound / 2, bound)


def slot_patience(patience: float, slot_ends_at: datetime | None, now: datetime) -> float:
    """``patience``, shortened so that retrying stops when the slot ends."""
    if slot_ends_at is None:
        return patience
    return max(0.0, min(patience, (slot_ends_at - now).total_seconds()))


class ConnectPatience:
    """The retry state of one attempt to connect, on the monotonic clock."""

    __slots__ = ("_rng", "attempts", "deadline")

    def __init__(self, patience: float, now: float, rng: random.Random | None = None) -> None:
        self.deadline = now + patience
        self.attempts = 0
        self._rng = rng

    def next_delay(self, error: BaseException, now: float) -> float | None:
        """How long to wait before trying again, or None to report ``error`` now."""
        if not is_transient(error) or now >= self.deadline:
            return None
        delay = backoff_delay(self.attempts, self._rng)
        self.attempts += 1
        # The last try happens at the deadline, not a whole pause after it.
        return min(delay, self.deadline - now)
