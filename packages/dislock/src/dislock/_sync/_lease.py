# GENERATED from dislock-aio's dislock/aio/_lease.py by tools/async_to_sync.py: do not edit.
# Change the asyncio source, then run `hatch run generate`.
"""``LeaseLock``: one holder at a time, for as long as the block runs.

Hand-written in ``dislock/aio/_lease.py``; ``dislock/_sync/_lease.py`` is
generated from it by ``tools/async_to_sync.py``.  The lease's clock, its
renewals' bookkeeping and its statements are ``dislock.core``'s; the renewing
itself is the hub's (``._hub``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from functools import partial
from time import monotonic

from dislock.core.acquisition import handing_over, let_go, releasing, trying_lease
from dislock.core.context import LeaseLossPolicy, LockContext
from dislock.core.errors import LeaseLostError, LockDelayedError, LockNotAcquiredError
from dislock.core.exits import Exc, ExcType, Tb
from dislock.core.failover import delayed
from dislock.core.kinds import LEASE
from dislock.core.lease import LeaseClock, LeaseSettings, raises_on_exit
from dislock.core.patience import ConnectPatience
from dislock.core.renewal import Renewal
from dislock.core.replace import POLL_SECONDS, SLACK_SECONDS
from dislock.core.replacing import marking, taking_over, withdrawing
from dislock.core.rows import lease_key
from dislock.core.supervision import LOSS_LOGGER
from dislock.core.unknown_outcome import HELD
from dislock.core.waiting import slot_keys

from ._acquiring import drive, hand_back_rows
from ._compat import Event, sleep
from ._hub import Hub, enter_hub, leave_hub
from ._recording import RunRecording, record_alone
from ._waiting import wait_for_release

logger = logging.getLogger("dislock")


class _Held:
    """One acquisition of a lease: its bookkeeping, and the hub renewing it."""

    __slots__ = ("hub", "renewal")

    def __init__(self, hub: Hub, renewal: Renewal) -> None:
        self.hub = hub
        self.renewal = renewal

    @property
    def clock(self) -> LeaseClock:
        return self.renewal.clock


class LeaseLock:
    """One holder at a time, for as long as the block runs.

    Entering inserts a row that expires ``run_ttl_seconds`` from now (or takes
    over an expired one) and hands the lease to the process's renewer, which
    extends it every ``lease_interval_seconds`` (guarded by the owner token)
    together with every other lease the process holds on that database, over
    one shared connection.  ``lease_lost`` is set as soon as the lease can no
    longer be vouched for: a renewal found the row gone, or the lease's local
    deadline passed without one succeeding.  Leaving expires the row, unless the
    lease was lost (the row may belong to someone else by then), and wakes the
    lease's waiters.

    A lock may be entered again once it has been left (never twice at once):
    ``lease_lost`` stays the same event, cleared as each acquisition starts, and
    ``fence``, ``lost_reason`` and ``renewals`` describe the latest acquisition.

    With ``LockContext.wait_seconds``, a lease held elsewhere is waited for (woken by
    its release, or by polling) before ``LockNotAcquiredError``; with
    ``LockContext.slots``, up to that many holders share it, each on a slot row of
    its own (``key`` names it).
    """

    def __init__(self, context: LockContext) -> None:
        self.settings = LeaseSettings.from_context(context)
        self.context = context
        self.key = lease_key(context.lock_key)
        """The row held: the lease's, or with ``LockContext.slots`` the slot's taken."""
        self._slot_keys = slot_keys(context.lock_key, context.slots)
        self.lease_lost = Event()
        """Set once the lease is lost.  One event for the lock's whole life
        (fetching it before entering is fine), cleared as each acquisition
        starts; after leaving, it still tells whether the lease was lost."""
        self.fence: int | None = None
        """The fencing token of the latest acquisition (with ``LockContext.fencing``)."""
        self._held: _Held | None = None
        self._clock: LeaseClock | None = None  # the latest acquisition's, kept after leaving
        self._delayed_until: datetime | None = None  # a lock delay that refused the last try
        self.records_history = context.history
        """Whether entering and leaving record the run (``LockContext.history``);
        ``acquire_locks`` turns it off for its locks and records the run itself."""
        self._recording: RunRecording | None = None
        self._replacing: str | None = None  # the holder a replacer asked for the lease

    @property
    def deadline(self) -> float | None:
        """While held: the ``time.monotonic()`` instant at which the lease counts as
        lost unless a renewal succeeds first; None when not held."""
        held = self._held
        return None if held is None else held.clock.deadline

    def follow_deadline(self, follower: Callable[[float], None] | None) -> None:
        """While held, have the renewer call ``follower`` with the new deadline after
        each renewal that succeeds (from its own thread or task: it must be quick and
        never raise); None stops it.  The supervisor keeps the command's guard told."""
        held = self._held
        if held is not None:
            held.renewal.on_renewed = follower

    @property
    def lost_reason(self) -> str | None:
        """Why the latest acquisition was lost (None while it is not)."""
        return None if self._clock is None else self._clock.lost_reason

    @property
    def replacing(self) -> bool:
        """Whether the latest acquisition's loss may be a replacement
        (``LeaseClock.replacing``): its command must be gone by its deadline."""
        return self._clock is not None and self._clock.replacing

    @property
    def renewals(self) -> int:
        """How many renewals of the latest acquisition succeeded."""
        return 0 if self._clock is None else self._clock.renewals

    def is_lost(self) -> bool:
        """Whether the lease is lost: ``lease_lost`` is set, or (while held) its
        local deadline has passed, which the watchdog may not have declared yet.
        A pure query: it sets nothing and logs nothing."""
        if self.lease_lost.is_set():
            return True
        held = self._held
        return held is not None and held.clock.past_deadline(monotonic())

    def declare_if_lost(self) -> bool:
        """``is_lost()``, and if so make it known: set ``lease_lost`` and log the
        reason (once per acquisition).  For code that acts on the loss without
        waiting for the watchdog, such as the supervisor at the deadline."""
        held = self._held
        if held is not None and held.clock.check_deadline(monotonic()):
            held.hub.declare_lost(held.renewal)
        return self.lease_lost.is_set()

    def __enter__(self) -> LeaseLock:
        if self._held is not None:
            raise RuntimeError("this LeaseLock is already held; create one per acquisition")
        self._replacing = None
        context = self.context
        hub = enter_hub(context.url, context.connect_timeout_seconds)
        held: _Held | None = None
        # One patience for every connection on the way to the decision (``_attempt``
        # connects first); a wait for the holder does not spend it (``wait_for_release``).
        patience = ConnectPatience(context.connect_patience_seconds, monotonic())
        try:
            taken = self._attempt(hub, patience)
            if taken is None and context.replace and self._delayed_until is None:
                taken = self._replace(hub, patience)
            if taken is None and context.wait_seconds > 0:
                attempt = partial(self._attempt, hub, patience)
                taken = wait_for_release(context, attempt, patience)
            if taken is None:
                if self._delayed_until is not None:
                    raise LockDelayedError(self._held_elsewhere(), self._delayed_until)
                raise LockNotAcquiredError(self._held_elsewhere())
            clock, fence = taken
            self.fence = fence
            held = _Held(
                hub=hub,
                renewal=Renewal(
                    key=self.key,
                    owner=context.owner,
                    table_parts=tuple(context.table_parts),
                    clock=clock,
                ),
            )
            # The previous acquisition's renewal is unregistered, and the hub sets
            # the events of registered renewals only: nothing sets it for that one now.
            self.lease_lost.clear()
            self._clock = clock
            hub.register(held.renewal, self.lease_lost)
            HELD.add(held.renewal.table_parts, self.key, context.owner)
            # Inside the try: an interruption from here on is handled below, and
            # one after it finds the lock ``holding``, so its exit releases it.
            self._held = held
        except LockNotAcquiredError:
            leave_hub(hub)
            raise
        except BaseException:
            # Interrupted (a signal, a cancellation) or failed (no thread could be
            # started) after the acquiring statement may have taken a row: hand back
            # whatever is ours rather than leave it to expire by its TTL.
            self._held = None
            if held is not None:
                hub.unregister(held.renewal)
            keys = [self.key] if context.slots == 1 else self._slot_keys
            hand_back_rows(hub, context, keys)
            if held is not None:
                self._let_go(self.key, released=False)  # handed back, if it could be
            leave_hub(hub)
            raise
        logger.info("acquired lease %s for %g s", self.key, self.settings.ttl)
        if self.records_history:
            try:
                self._recording = record_alone(self.context, LEASE, lease=self)
            except BaseException as error:  # interrupted: give the lease back too
                self.__exit__(type(error), error, error.__traceback__)
                raise
        return self

    def _held_elsewhere(self) -> str:
        context = self.context
        waited = f" (waited {context.wait_seconds:g} s)" if context.wait_seconds > 0 else ""
        if context.slots > 1:
            lease = lease_key(context.lock_key)
            if self._delayed_until is not None:
                return delayed(f"no slot of lease {lease!r}", self._delayed_until) + waited
            return f"all {context.slots} slots of lease {lease!r} are held{waited}"
        if self._delayed_until is not None:
            return delayed(f"lease {self.key!r}", self._delayed_until) + waited
        if self._replacing is not None:
            return (
                f"lease {self.context.lock_key!r} was not handed over by {self._replacing},"
                f" which was asked to stop (replace), before its row expired{waited}"
            )
        return f"lease {self.key!r} is held by another owner{waited}"

    def _replace(self, hub: Hub, patience: ConnectPatience) -> tuple[LeaseClock, int | None] | None:
        """Ask the lease's live holder to stop and hand it over, then take it: as soon
        as the holder's work is gone and it handed the row over, else once the row
        expires (a dead or frozen holder); None if neither happened by then."""
        context = self.context
        timeout = max(self.settings.interval, 1.0)
        text, marked = drive(hub, marking(context, self.key, timeout, patience))
        if marked is None:  # free by now, or being replaced already
            return self._attempt(hub, patience)
        self._replacing = marked.holder
        logger.info(
            "lease %r is held by %s: asked it to stop and hand the lease over (replace)",
            context.lock_key,
            marked.holder,
        )
        until = monotonic() + marked.remaining + SLACK_SECONDS
        try:
            while True:
                tried = drive(hub, taking_over(context, self.settings, patience, text))
                if tried is not None:
                    self.key = tried.key
                    assert tried.clock is not None
                    return tried.clock, tried.fence
                # Expired unhanded (a dead or frozen holder), or released.
                taken = self._attempt(hub, patience)
                if taken is not None:
                    return taken
                if monotonic() >= until:
                    break
                sleep(min(POLL_SECONDS, max(0.0, until - monotonic())))
        except BaseException:
            # Interrupted or failed: the holder is not left stopping for nobody.
            drive(hub, withdrawing(context, self.key, text))
            raise
        drive(hub, withdrawing(context, self.key, text))
        return None

    def _attempt(self, hub: Hub, patience: ConnectPatience) -> tuple[LeaseClock, int | None] | None:
        """One try at the lease (or at a free slot of it): its clock and fencing
        token when taken."""
        tried = drive(hub, trying_lease(self.context, self.settings, patience))
        self.key, self._delayed_until = tried.key, tried.delayed_until
        return None if tried.clock is None else (tried.clock, tried.fence)

    def _let_go(self, key: str, *, released: bool) -> None:
        let_go(self.context, key, self.settings.ttl, released=released, now=monotonic())

    @property
    def holding(self) -> bool:
        """Whether the lease is held (taken, and not yet released)."""
        return self._held is not None

    def __exit__(self, exc_type: ExcType, exc: Exc, tb: Tb) -> None:
        held = self._held
        assert held is not None, "LeaseLock exited without entering"
        # Judged as the block ends: a renewal finishing afterwards does not
        # turn finished work into failed work.
        lost = self.declare_if_lost()
        recording, self._recording = self._recording, None
        if recording is not None:  # while the lease is held, as acquire_locks records
            try:
                recording.__exit__(exc_type, exc, tb)
            except BaseException:
                self._leave(held, lost=lost, block_failed=True)
                raise
        self._leave(held, lost=lost, block_failed=exc_type is not None)

    def _leave(self, held: _Held, *, lost: bool, block_failed: bool) -> None:
        held.hub.unregister(held.renewal)
        self._held = None
        released = False
        try:
            # A renewal of this lease still in flight runs before the release on
            # the shared connection, and one stuck on a retired connection finds
            # the row expired (renewals skip expired rows): the release stands.
            if not lost and not held.clock.check_deadline(monotonic()):
                released = drive(
                    held.hub, releasing(self.context, held.renewal.key, self.settings.ttl)
                )
            elif held.clock.row_gone:
                # Its work is over: a replacer that marked the row takes it now.
                drive(held.hub, handing_over(self.context, held.renewal.key))
        finally:
            self._let_go(held.renewal.key, released=released)
            leave_hub(held.hub)
        if lost and self.settings.policy is LeaseLossPolicy.CONTINUE:
            logging.getLogger(LOSS_LOGGER).warning(
                "lease %s was lost during the block (policy: continue)", self.key
            )
        if raises_on_exit(self.settings.policy, lost=lost, block_failed=block_failed):
            raise LeaseLostError(
                f"lease {self.key!r} was lost while the block ran: {held.clock.lost_reason}",
                reason=held.clock.lost_reason,
            )
