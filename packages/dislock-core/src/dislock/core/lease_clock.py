"""The lease's bookkeeping on the local monotonic clock, as a small state object.

The shells feed it what happened (a renewal sent at ``t`` affected ``n`` rows, a
renewal raised) and ask it what to do (how long to sleep, whether the lease is
still ours).  It never reads a clock itself, which keeps it deterministic.

The local deadline is conservative: a renewal *sent* at ``t`` makes the server
set ``expire_at`` to its own ``NOW() + ttl`` with ``NOW()`` no earlier than
``t``, so until ``t + ttl`` on our monotonic clock nobody else can hold the row,
whatever the wall clocks of either side say.  The deadline is set a margin
earlier still, so that a wrapped command is already being stopped when the row
becomes free on the server, not a moment after.
"""

from __future__ import annotations

from typing import NamedTuple

from dislock.core.context import LeaseLossPolicy, LockContext
from dislock.core.dsn import one_line
from dislock.core.errors import ConfigurationError

RETRY_FLOOR = 0.05
"""Shortest pause between two attempts at a failing renewal."""

SAFETY_MARGIN_RATIO = 0.1
SAFETY_MARGIN_MAX = 1.0
"""The local deadline comes 10 % of the TTL (at most 1 s) before the row can expire."""

ATTEMPT_FLOOR = 1.0
"""A renewal statement is never cancelled sooner than this, deadline permitting."""


def safety_margin(ttl: float) -> float:
    """How long before the row can expire the lease's local deadline comes."""
    return min(ttl * SAFETY_MARGIN_RATIO, SAFETY_MARGIN_MAX)


class LeaseSettings(NamedTuple):
    """The lease-specific part of a LockContext, checked to be present."""

    ttl: float
    interval: float
    policy: LeaseLossPolicy

    @classmethod
    def from_context(cls, context: LockContext) -> LeaseSettings:
        names = ("run_ttl_seconds", "lease_interval_seconds")
        missing = " and ".join(name for name in names if getattr(context, name) is None)
        if missing:
            raise ConfigurationError(f"a lease lock needs {missing} in its LockContext")
        ttl, interval = context.run_ttl_seconds, context.lease_interval_seconds
        # LockContext has already checked the interval against the TTL.
        assert ttl is not None and interval is not None
        return cls(ttl, interval, context.lease_loss_policy)


class LeaseClock:
    """When to renew, and whether the lease is still held, for one acquired lease."""

    def __init__(self, settings: LeaseSettings, *, acquired_at: float) -> None:
        """``acquired_at``: monotonic time just before the acquiring statement was sent."""
        self.settings = settings
        self.margin = safety_margin(settings.ttl)
        # A heartbeat as slow as the TTL (allowed: interval <= TTL) would renew
        # only after the deadline; at least two heartbeats fit in every lease.
        self.cadence = min(settings.interval, (settings.ttl - self.margin) / 2)
        self.deadline = acquired_at + settings.ttl - self.margin
        self.next_renewal = acquired_at + self.cadence
        self.lost_reason: str | None = None
        self.last_error: str | None = None
        self.renewals = 0
        self.row_gone = False
        """Whether a renewal found the row no longer ours (rather than a deadline passing)."""
        self.replaced_by: str | None = None
        """Who the row was handed over to, when a replacer marked it (``replace_marks``)."""
        self.explained = False
        """Whether the row found gone was read since, to tell a replacement (``replaced``)."""

    @property
    def lost(self) -> bool:
        return self.lost_reason is not None

    def until_deadline(self, now: float) -> float:
        return max(0.0, self.deadline - now)

    def delay_until_renewal(self, now: float) -> float:
        return max(0.0, self.next_renewal - now)

    def renewed(self, *, sent_at: float, now: float, rows: int) -> bool:
        """Record a finished renewal; returns whether the lease is still held."""
        if self.lost:
            return False
        if rows != 1:
            self.row_gone = True
            return self._lose(
                "the lock row is no longer ours (expired, released or taken by another owner)"
            )
        if now >= self.deadline:  # as past_deadline judges it: the deadline itself is too late
            return self._lose(
                f"a renewal returned {now - self.deadline:.3f} s after the local deadline"
            )
        self.deadline = sent_at + self.settings.ttl - self.margin
        self.next_renewal = sent_at + self.cadence
        self.renewals += 1
        return True

    def failed(self, error: BaseException | str, *, now: float) -> bool:
        """Record a renewal attempt that raised (``error``, or its line already scrubbed
        of the URL's secrets, ``dislock.core.dsn.error_line``, which ``last_error``
        and the loss's reason quote); returns whether the lease is still held: the
        row stays ours until the deadline, so the attempt is retried until then."""
        self.last_error = (
            error if isinstance(error, str) else f"{type(error).__name__}: {one_line(str(error))}"
        )
        if self.check_deadline(now):
            return False
        self.next_renewal = now + self.retry_delay(now)
        return True

    def replaced(self, successor: str | None, released: str | None = None) -> None:
        """Record what the row a renewal found gone showed when read: marked for
        ``successor`` (the loss is a replacement, and says by whom), or not (None);
        ``released``: the reason, when an operator released it (``dislockctl release``)."""
        if self.row_gone:
            self.explained = True
            if successor is not None:
                self.replaced_by = successor
                self.lost_reason = f"replaced by {successor}"
            elif released is not None:
                self.lost_reason = f"the lock row is no longer ours: {released}"

    @property
    def replacing(self) -> bool:
        """Whether the loss may be a replacement: the row was marked for a successor, or
        was found gone and could not be read since.  Its row then stays live until its
        expiry, for the successor, so the command must be gone by the deadline."""
        return self.replaced_by is not None or (self.row_gone and not self.explained)

    def attempt_timeout(self, now: float) -> float:
        """How long one renewal statement may take before it is cancelled: a heartbeat
        (never under a second, which a loaded server can need), or less if the deadline
        comes first: a row locked by another transaction must not hold the renewer past it."""
        remaining = self.deadline - now
        return max(RETRY_FLOOR, min(remaining, max(self.cadence, ATTEMPT_FLOOR)))

    def retry_delay(self, now: float) -> float:
        """Retry soon enough to land several attempts before the deadline, never
        faster than every 50 ms nor slower than the heartbeat."""
        return min(self.cadence, max(RETRY_FLOOR, (self.deadline - now) / 4))

    def past_deadline(self, now: float) -> bool:
        """Whether the lease is lost or its local deadline has passed; records nothing."""
        return self.lost or now >= self.deadline

    def check_deadline(self, now: float) -> bool:
        """Record the loss if the local deadline has passed (the row may be someone
        else's by then); whether the lease is lost.  ``past_deadline`` only asks."""
        if not self.lost and now >= self.deadline:
            last = f" (last error: {self.last_error})" if self.last_error else ""
            self._lose(f"no renewal succeeded before the local deadline{last}")
        return self.lost

    def _lose(self, reason: str) -> bool:
        if self.lost_reason is None:
            self.lost_reason = reason
        return False


def raises_on_exit(policy: LeaseLossPolicy, *, lost: bool, block_failed: bool) -> bool:
    """Whether leaving a lease lock must raise ``LeaseLostError``: never over an
    exception already leaving the block, and ``CONTINUE`` only logs."""
    return lost and not block_failed and policy is LeaseLossPolicy.TERMINATE
