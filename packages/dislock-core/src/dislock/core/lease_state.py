"""What a ``LeaseLock`` knows and says, whichever its flavour: the latest
acquisition's bookkeeping, the questions asked of it (its deadline, whether it is
lost, why) and the words of a refusal.  Both flavours' ``LeaseLock`` extend
``LeaseState`` with what sends statements: entering, replacing and leaving.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, Protocol, TypeVar

from dislock.core.acquisition import Given
from dislock.core.context import LockContext
from dislock.core.errors import LockDelayedError, LockNotAcquiredError
from dislock.core.failover import delayed
from dislock.core.lease_acquisition import LeaseTry, let_go
from dislock.core.lease_clock import LeaseClock, LeaseSettings
from dislock.core.renewal import Renewal
from dislock.core.waiting import slot_keys


class Renewing(Protocol):
    """What a lease asks of the hub renewing it, without waiting on anything."""

    def declare_lost(self, renewal: Renewal) -> None: ...


class LossEvent(Protocol):
    """The flavour's event that a lease is lost (set by the renewer, not here)."""

    def clear(self) -> None: ...

    def is_set(self) -> bool: ...


HubT = TypeVar("HubT", bound=Renewing)
EventT = TypeVar("EventT", bound=LossEvent)


@dataclass(eq=False, slots=True)
class Held(Generic[HubT]):
    """One acquisition of a lease: its renewer's bookkeeping, and the hub renewing it."""

    hub: HubT
    renewal: Renewal

    @property
    def clock(self) -> LeaseClock:
        return self.renewal.clock


class LeaseState(Generic[HubT, EventT]):
    """A lease lock's state between statements (see the flavour's ``LeaseLock``)."""

    def __init__(self, context: LockContext, lease_lost: EventT, given: Given) -> None:
        self.given = given  # the clocks and the process's rows
        self.settings = LeaseSettings.from_context(context)
        self.context = context
        self._slot_keys = slot_keys(context.lock_key, context.slots, context.lease_mode)
        self.key = self._slot_keys[0]
        """The row held: the lease's, or with ``LockContext.slots`` the slot's taken."""
        self.lease_lost = lease_lost
        """Set once the lease is lost; one event for the lock's whole life, cleared as each
        acquisition starts (fetch it before entering; after leaving it still tells)."""
        self.fence: int | None = None
        """The fencing token of the latest acquisition (with ``LockContext.fencing``)."""
        self._held: Held[HubT] | None = None
        self._clock: LeaseClock | None = None  # the latest acquisition's, kept after leaving
        self._delayed_until: datetime | None = None  # a lock delay that refused the last try
        self.records_history = context.history
        self.last_success: datetime | None = None
        """With the history: the start of the key's last successful run before this
        one (``dislock.core.slot_context.last_success``); None when there is none."""
        """Whether entering and leaving record the run (``LockContext.history``);
        ``acquire_locks`` turns it off for its locks and records the run itself."""
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

    @property
    def holding(self) -> bool:
        """Whether the lease is held (taken, and not yet released)."""
        return self._held is not None

    def is_lost(self) -> bool:
        """Whether the lease is lost: ``lease_lost`` is set, or (while held) its
        local deadline has passed, which the watchdog may not have declared yet.
        A pure query: it sets nothing and logs nothing."""
        if self.lease_lost.is_set():
            return True
        held = self._held
        return held is not None and held.clock.past_deadline(self.given.clock())

    def declare_if_lost(self) -> bool:
        """``is_lost()``, and if so make it known: set ``lease_lost`` and log the
        reason (once per acquisition).  For code that acts on the loss without
        waiting for the watchdog, such as the supervisor at the deadline."""
        held = self._held
        if held is not None and held.clock.check_deadline(self.given.clock()):
            held.hub.declare_lost(held.renewal)
        return self.lease_lost.is_set()

    def _tried(self, tried: LeaseTry) -> tuple[LeaseClock, int | None] | None:
        """Note one try's row and lock delay: its clock and fencing token when taken."""
        self.key, self._delayed_until = tried.key, tried.delayed_until
        return None if tried.clock is None else (tried.clock, tried.fence)

    def _holding_now(self, hub: HubT, clock: LeaseClock, fence: int | None) -> Held[HubT]:
        """Start the bookkeeping of an acquisition just taken (the caller registers it)."""
        self.fence = fence
        self._clock = clock
        # The previous acquisition's renewal is unregistered, and the hub sets the
        # events of registered renewals only: nothing sets it for that one now.
        self.lease_lost.clear()
        context = self.context
        renewal = Renewal(
            key=self.key, owner=context.owner, table_parts=tuple(context.table_parts), clock=clock
        )
        return Held(hub, renewal)

    def _let_go(self, key: str, *, released: bool) -> None:
        let_go(self.context, key, self.settings.ttl, released=released, given=self.given)

    def _not_taken(self) -> LockNotAcquiredError:
        """The error of an acquisition that took nothing: held, or delayed."""
        if self._delayed_until is not None:
            return LockDelayedError(self._held_elsewhere(), self._delayed_until)
        return LockNotAcquiredError(self._held_elsewhere())

    def _held_elsewhere(self) -> str:
        context = self.context
        waited = f" (waited {context.wait_seconds:g} s)" if context.wait_seconds > 0 else ""
        if context.lease_mode == "group" and self._delayed_until is None:
            return (
                f"group {context.lock_key!r} is full: all {context.slots} slots are held"
                f" by other runs{waited}"
            )
        if context.slots > 1:
            lease = self._slot_keys[0]
            if self._delayed_until is not None:
                return delayed(f"no slot of lease {lease!r}", self._delayed_until) + waited
            return f"all {context.slots} slots of lease {lease!r} are held{waited}"
        if self._delayed_until is not None:
            return delayed(f"lease {self.key!r}", self._delayed_until) + waited
        if self._replacing is not None:
            return (
                f"lease {context.lock_key!r} was not handed over by {self._replacing},"
                f" which was asked to stop (replace), before its row expired{waited}"
            )
        return f"lease {self.key!r} is held by another owner{waited}"
