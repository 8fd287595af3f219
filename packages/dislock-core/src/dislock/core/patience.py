"""Connection patience: which failures to wait out, how long, and how long each try waits
(docs/guarantees.md, "Connecting when the whole fleet does").

Only *opening* a connection is retried: a statement that failed mid-way may have taken
effect (``dislock.core.unknown_outcome``).  Two answers a failover gives for a moment
are waited out too (``passing_answer``), the try sent again afresh.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime
from typing import NamedTuple

from dislock.core.dsn import one_line
from dislock.core.errors import DatabaseUnreachableError, NotReplicatedError, StatementTimeout

BACKOFF_FIRST = 0.05
"""Upper bound of the first pause between two connection attempts, in seconds."""

BACKOFF_CAP = 2.0
"""The pauses double up to this bound, so that a freed slot is found soon."""

FIRST_ATTEMPT_TIMEOUT = 2.0
"""Seconds each host gets on a patient lock's first try, doubling with each try up to
the connect timeout: a host that never answers costs 2 s, not 10."""

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
    # A Unix socket whose listen queue is full (EAGAIN): a herd's connections
    # arrived faster than the postmaster accepts them.
    "resource temporarily unavailable",
    # A host that never answers (frozen, partitioned, a failed-over primary):
    # psycopg's "connection timeout expired", libpq's "timeout expired".
    "timeout expired",
    # Only standbys answered a URL that asks for the primary
    # (target_session_attrs=read-write or primary): one is being promoted.
    "session is read-only",
    "server is in hot standby mode",
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


def passing_answer(error: BaseException) -> bool:
    """Whether a statement's error is an answer a failover gives for a moment: a
    server that answers read-only (a standby, a demoting primary), an acquisition
    synchronous replication did not confirm, or one cancelled at its timeout,
    queued behind a row such a commit still locks (all handed back)."""
    if isinstance(error, NotReplicatedError | StatementTimeout):
        return True
    sqlstate = getattr(error, "sqlstate", None)
    return sqlstate == "25006" or (sqlstate == "55000" and "recovery is in progress" in str(error))


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


class SlotEnd(NamedTuple):
    """The end of the schedule slot a lock is taking, and the local clock's time
    when it was read."""

    lock_key: str
    at: datetime
    now: datetime


class ConnectPatience:
    """The patience of one acquisition, on the monotonic clock: the connections it
    opens retry until one deadline, ``patience`` after ``now`` or the end of the
    slot (``slot``, asked at the first failure) if sooner.  Time spent waiting for
    another holder (``postpone``) is not spent on the patience."""

    __slots__ = (
        "_deadline",
        "_rng",
        "_slot",
        "_slot_end",
        "attempts",
        "failing_since",
        "failures",
        "lost_answer_of",
        "patience",
        "started",
    )

    def __init__(
        self,
        patience: float,
        now: float,
        rng: random.Random | None = None,
        *,
        slot: Callable[[], SlotEnd | None] | None = None,
    ) -> None:
        self.patience = patience
        self.started = now
        self.attempts = 0  # pauses handed out
        self.failures = 0  # failed tries
        self.failing_since: float | None = None  # when the first failed try started
        self.lost_answer_of: str | None = None
        """The acquisition (in words) whose answer a lost connection took, once one did:
        giving up then leaves its outcome unknown, which the error says."""
        self._rng = rng
        self._slot = slot
        self._slot_end: SlotEnd | None = None  # when the slot's end is the deadline
        self._deadline: float | None = None

    def deadline(self, now: float) -> float:
        """The instant retrying stops (fixed by the first call)."""
        if self._deadline is None:
            self._deadline = self.started + self.patience
            slot = None if self._slot is None else self._slot()
            if slot is not None:
                left = slot_patience(self._deadline - now, slot.at, slot.now)
                if now + left < self._deadline:
                    self._deadline = now + left
                    self._slot_end = slot
        return self._deadline

    def postpone(self, seconds: float) -> None:
        """Move the deadline ``seconds`` later: the lock waited for another holder,
        not for the database (a slot's end stays put)."""
        if self._slot_end is not None:
            return
        self.started += seconds
        if self._deadline is not None:
            self._deadline += seconds

    def attempt_timeout(self, longest: float, hosts: int, now: float) -> float:
        """The connect timeout of the next try, for each of the URL's ``hosts``:
        ``FIRST_ATTEMPT_TIMEOUT`` doubled per failed try, at most ``longest`` and the
        patience left shared among the hosts.  Without patience, ``longest``."""
        if self.patience <= 0:
            return longest
        floor = min(longest, FIRST_ATTEMPT_TIMEOUT)
        timeout = min(longest, FIRST_ATTEMPT_TIMEOUT * 2.0 ** min(self.failures, 16))
        if self._deadline is not None:
            timeout = min(timeout, (self._deadline - now) / max(1, hosts))
        return max(floor, timeout)

    def _failed(self, now: float, attempt_started: float | None) -> None:
        self.failures += 1
        if self.failing_since is None:
            self.failing_since = now if attempt_started is None else attempt_started

    def _backoff(self, now: float) -> float | None:
        deadline = self.deadline(now)
        if now >= deadline:
            return None
        delay = backoff_delay(self.attempts, self._rng)
        self.attempts += 1
        # The last try happens at the deadline, not a whole pause after it.
        return min(delay, deadline - now)

    def next_delay(
        self, error: BaseException, now: float, *, attempt_started: float | None = None
    ) -> float | None:
        """How long to wait before trying again after ``error`` (the try having
        started at ``attempt_started``), or None to report it now."""
        self._failed(now, attempt_started)
        if not (is_transient(error) or passing_answer(error)):
            return None
        return self._backoff(now)

    def answer_lost(self, what: str, now: float, *, attempt_started: float) -> float | None:
        """An acquiring statement for ``what`` (in words), sent at ``attempt_started``,
        lost its answer (``dislock.core.unknown_outcome``): how long to wait before
        finding out what it did, or None once the patience is spent.  Counted as a
        failed try; no wait after the first loss (the reconnection has pauses of its
        own), the usual backoff after a read that lost its answer too."""
        first = self.lost_answer_of is None
        self._failed(now, attempt_started)
        self.lost_answer_of = what
        if first:
            return 0.0 if now < self.deadline(now) else None
        return self._backoff(now)

    def answer_found(self) -> None:
        """The read after a lost answer succeeded: the outcome is known again."""
        self.lost_answer_of = None

    def unreachable(
        self, error: BaseException, detail: str, now: float
    ) -> DatabaseUnreachableError | None:
        """The error to report once ``next_delay`` gave up on ``error``, saying for how
        long the database was unreachable; None to report ``error`` itself."""
        return self.gave_up(detail, now) if is_transient(error) else None

    def _tried(self, now: float) -> tuple[float, str]:
        """For how long the tries failed, and how many there were, in words."""
        since = self.failing_since if self.failing_since is not None else now
        return max(0.0, now - since), f"{self.failures} attempt{'s' if self.failures != 1 else ''}"

    def still_answered(self, error: Exception, now: float) -> Exception:
        """The error to raise once ``next_delay`` gave up on a ``passing_answer``:
        ``error`` itself without patience (nothing was waited out), else one of its
        kind (its SQLSTATE, so the same advice) that says for how long it was tried."""
        if self.patience <= 0:
            return error
        seconds, tries = self._tried(now)
        within = (
            f"within a connect patience of {self.patience:g} s"
            if self._slot_end is None
            else "until the schedule slot ended"
        )
        return type(error)(
            f"{one_line(str(error))} (answered so for {seconds:.1f} s, {tries}, {within})"
        )

    def gave_up(self, detail: str, now: float) -> DatabaseUnreachableError:
        """The error once the tries gave up (``answer_lost``, ``next_delay``)."""
        unreachable_for, tries = self._tried(now)
        slot, lost = self._slot_end, self.lost_answer_of
        after = (
            ""
            if lost is None
            else f"; the connection was lost during the acquisition of {lost}, whose outcome"
            " is unknown (a row it took expires by itself)"
        )
        if slot is not None:
            message = (
                f"the schedule slot of {slot.lock_key!r} ending {slot.at.isoformat()} ended"
                f" while the database was unreachable ({unreachable_for:.1f} s, {tries}){after}:"
                f" {detail}"
            )
        else:
            message = (
                f"the database was unreachable for {unreachable_for:.1f} s ({tries};"
                f" connect_patience_seconds={self.patience:g}){after}: {detail}"
            )
        return DatabaseUnreachableError(
            message,
            detail=detail,
            unreachable_for=unreachable_for,
            attempts=self.failures,
            patience=self.patience,
            slot_end=None if slot is None else slot.at,
            lock_key=None if slot is None else slot.lock_key,
            lost_answer_of=lost,
        )
