"""The exception hierarchy every dislock distribution raises."""

from __future__ import annotations

from datetime import datetime

from psycopg import OperationalError


class DislockError(Exception):
    """Base class of every error dislock raises on purpose."""


class ConfigurationError(DislockError, ValueError):
    """A lock was configured with a missing, malformed or contradictory value.

    It is also a ``ValueError`` so that callers validating input the usual way
    catch it too.
    """


class LockNotAcquiredError(DislockError):
    """Another owner holds the lock: the schedule slot or the lease is taken."""


class SlotLateError(LockNotAcquiredError):
    """A schedule slot was not started because its start deadline had passed
    (``LockContext.start_deadline_seconds``), and this acquisition marked it late
    (one acquisition does; those after it, past the deadline too, find the slot
    taken and raise a plain ``LockNotAcquiredError``)."""


class LockDelayedError(LockNotAcquiredError):
    """Nobody may take the lock yet: the lock delay after a database failover is running
    (``dislock.core.failover``), so that a holder cut off with the old primary has
    passed its deadline first.  Unlike a lock someone holds, it concerns every key:
    the CLI says so as a WARNING."""

    def __init__(self, message: str, until: datetime) -> None:
        super().__init__(message)
        self.until = until
        """When the delay ends (database clock)."""


class KeyNotGrantedError(DislockError):
    """The database refused the lock row: the role's grant does not cover the key
    (``dislockctl grant``, row-level security).  Nothing was written."""


class LockPausedError(LockNotAcquiredError):
    """The lock key is paused fleet-wide (``dislockctl pause``): nobody may start it.

    A ``LockNotAcquiredError``, so that code skipping a held lock skips a paused
    one the same way.
    """

    def __init__(self, message: str, *, reason: str, until: datetime | None) -> None:
        super().__init__(message)
        self.reason = reason
        """What the operator gave as the reason (may be empty)."""
        self.until = until
        """When the pause ends (database clock)."""


class LeaseLostError(DislockError):
    """The lease stopped being held while the guarded block was running.

    Raised on leaving a ``LeaseLock`` under ``LeaseLossPolicy.TERMINATE`` when
    the block itself finished without an exception, so that work done on a lost
    lease never looks like a clean success.  ``reason`` says why it was lost.
    """

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class MaxRuntimeExceeded(DislockError):
    """A guarded block ran past ``LockContext.max_runtime_seconds``.

    Not a ``TimeoutError``: that is an ``OSError``, and a block's own ``except
    OSError`` (a retry around file or network calls) must not swallow its bound.

    ``dislock.aio`` cancels the task running the block at the bound and raises
    this in place of the ``CancelledError``; the sync flavour cannot interrupt a
    thread, so a block that finishes past its bound raises it as it ends
    (``LockSession.time_left`` lets it stop at a safe point before).  A wrapped
    command is stopped instead, and the wrapper exits ``MAX_RUNTIME_EXIT_CODE``.
    """


class StatementTimeout(DislockError, TimeoutError):
    """A lock statement got no answer in time and was cancelled.

    Renewals are bounded so that a row locked by someone else's transaction, or
    a server that stopped answering, cannot hold the renewer past its deadline;
    the attempt is retried until then.
    """


class NotSent(StatementTimeout):
    """The statement was never sent: the shared connection it waited for is stuck
    in another statement, so it may be sent again on a new connection.  (Internal:
    asyncio statements queue inside psycopg, so only the sync side raises it.)"""


class NotReplicatedError(DislockError):
    """A lock statement committed on the primary, but synchronous replication never
    confirmed it (the server's wait for its standbys was cancelled).

    A failover could lose such a row, so it is not a success: an acquisition is
    handed back and raises this; a renewal counts as a failed attempt and is
    retried until the lease's deadline.
    """


class DatabaseUnreachableError(DislockError, OperationalError):
    """No connection to the database could be opened in time: every attempt failed
    the way a busy, restarting or failing-over server fails (refused, timed out, no
    primary among the hosts), until ``LockContext.connect_patience_seconds`` ran out
    or, for a schedule lock, until the slot being taken ended.  Also raised when
    the connection was lost during an acquiring statement and the patience ran
    out before the lock could find out whether it took its row
    (``lost_answer_of``).

    Also an ``OperationalError``, the driver's class for the same failure, so that
    code catching that still does; the driver's last error is the ``__cause__``.
    """

    def __init__(
        self,
        message: str,
        *,
        detail: str,
        unreachable_for: float,
        attempts: int,
        patience: float,
        slot_end: datetime | None = None,
        lock_key: str | None = None,
        lost_answer_of: str | None = None,
    ) -> None:
        super().__init__(message)
        self.detail = detail
        """The driver's words for the last failure (without secrets)."""
        self.unreachable_for = unreachable_for
        """Seconds from the first failed attempt to giving up."""
        self.attempts = attempts
        """How many attempts failed."""
        self.patience = patience
        """The patience the lock was given, in seconds."""
        self.slot_end = slot_end
        """When the slot's end (not the patience) stopped the wait: that end."""
        self.lock_key = lock_key
        """With ``slot_end``: the lock whose slot it was."""
        self.lost_answer_of = lost_answer_of
        """The acquisition (in words) whose answer the connection lost before this, if
        one did: whether it took its row is unknown (a row it took expires by itself)."""


class Interrupted(KeyboardInterrupt):
    """A signal ended the wait for the locks, before the command started.

    A ``KeyboardInterrupt`` (not a ``DislockError``), so that psycopg cancels a
    statement it interrupts and no ``except Exception`` in the lock code swallows
    it; ``run_with_locks`` returns 128 + ``signum`` for it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
