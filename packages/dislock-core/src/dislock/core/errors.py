"""The exception hierarchy every dislock distribution raises."""

from __future__ import annotations

from datetime import datetime

from psycopg import OperationalError


class DislockError(Exception):
    """Base class of every error dislock raises on purpose."""


class ConfigurationError(DislockError, ValueError):
    """A lock was configured with a missing, malformed or contradictory value (also a
    ``ValueError``)."""


class LockNotAcquiredError(DislockError):
    """Another owner holds the lock: the schedule slot or the lease is taken."""


class SlotLateError(LockNotAcquiredError):
    """A schedule slot was not started because its start deadline had passed
    (``LockContext.start_deadline_seconds``), and this acquisition marked it late
    (those after it find the slot taken: a plain ``LockNotAcquiredError``)."""


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
    """The lock key is paused fleet-wide (``dislockctl pause``): nobody may start it
    (a ``LockNotAcquiredError``: code skipping a held lock skips a paused one)."""

    def __init__(self, message: str, *, reason: str, until: datetime | None) -> None:
        super().__init__(message)
        self.reason = reason
        """What the operator gave as the reason (may be empty)."""
        self.until = until
        """When the pause ends (database clock)."""


class LeaseLostError(DislockError):
    """The lease stopped being held while the guarded block was running: raised on
    leaving a ``LeaseLock`` under ``LeaseLossPolicy.TERMINATE`` when the block itself
    succeeded, so that work done on a lost lease never looks like a clean success."""

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class MaxRuntimeExceeded(DislockError):
    """A guarded block ran past ``LockContext.max_runtime_seconds``: ``dislock.aio``
    cancels it at the bound; a sync block raises it as it ends late
    (``LockSession.time_left`` lets it stop before).

    Not a ``TimeoutError``: that is an ``OSError``, and a block's own ``except
    OSError`` (a retry around file or network calls) must not swallow its bound.
    """


class StatementTimeout(DislockError, TimeoutError):
    """A lock statement got no answer in time and was cancelled (a renewal is
    retried until the lease's deadline)."""


class NotSent(StatementTimeout):
    """The statement was never sent: the shared connection it waited for is stuck
    in another statement, so it may be sent again on a new connection.  (Internal:
    asyncio statements queue inside psycopg, so only the sync side raises it.)"""


class NotReplicatedError(DislockError):
    """A lock statement committed on the primary, but synchronous replication never
    confirmed it: a failover could lose the row, so an acquisition is handed back
    and raises this, a renewal is retried until the lease's deadline."""


class DatabaseUnreachableError(DislockError, OperationalError):
    """No connection to the database could be opened in time (a busy, restarting or
    failing-over server) within ``LockContext.connect_patience_seconds`` or, for a
    schedule lock, before the slot ended; or the connection was lost during an
    acquiring statement and its outcome could not be found out (``lost_answer_of``).

    Also an ``OperationalError``, the driver's class for the same failure; the
    driver's last error is the ``__cause__``.
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
    """A signal ended the wait for the locks, before the command started.  A
    ``KeyboardInterrupt``, so that psycopg cancels a statement it interrupts and no
    ``except Exception`` swallows it; ``run_with_locks`` returns 128 + ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
