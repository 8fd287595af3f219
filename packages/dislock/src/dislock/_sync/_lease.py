# GENERATED from dislock-aio's dislock/aio/_lease.py by tools/async_to_sync.py: do not edit.
# Change the asyncio source, then run `hatch run generate`.
"""``LeaseLock``: one holder at a time, for as long as the block runs.

The lease's clock, its state between statements, its renewals' bookkeeping and the
order of its statements are ``dislock.core``'s; the renewing itself is the hub's
(``._hub``).
"""

from __future__ import annotations

import logging
from functools import partial

from dislock.core.acquisition import handing_back
from dislock.core.context import LeaseLossPolicy, LockContext
from dislock.core.errors import LeaseLostError, LockNotAcquiredError
from dislock.core.exit_arguments import Exc, ExcType, Tb
from dislock.core.kinds import LEASE
from dislock.core.lease_acquisition import handing_over, releasing, trying_lease
from dislock.core.lease_clock import LeaseClock, raises_on_exit
from dislock.core.lease_state import Held, LeaseState
from dislock.core.observing import note
from dislock.core.patience import ConnectPatience
from dislock.core.supervision import LOSS_LOGGER

from ._compat import Event
from ._hub import GIVEN, Hub, enter_hub, leave_hub
from ._recording import Alone, RunRecording

logger = logging.getLogger("dislock")


class LeaseLock(LeaseState[Hub, Event]):
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
    its own (``key`` names it).  What it knows between statements (``deadline``,
    ``is_lost()``, ``lost_reason``, …) is ``dislock.core.lease_state.LeaseState``'s.
    """

    def __init__(self, context: LockContext) -> None:
        super().__init__(context, Event(), GIVEN)
        self._recording: RunRecording | None = None

    def __enter__(self) -> LeaseLock:
        if self._held is not None:
            raise RuntimeError("this LeaseLock is already held; create one per acquisition")
        self._replacing = None
        context = self.context
        hub = enter_hub(context.url, context.connect_timeout_seconds)
        held: Held[Hub] | None = None
        # One patience for every connection on the way to the decision (``_attempt``
        # connects first); a wait for the holder does not spend it (``wait_for_release``).
        patience = ConnectPatience(context.connect_patience_seconds, self.given.clock())
        try:
            taken = self._attempt(hub, patience)
            if taken is None and context.replace and self._delayed_until is None:
                taken = self._replace(hub, patience)
            if taken is None and context.wait_seconds > 0:
                from ._waiting import wait_for_release  # (a lone run never waits: not imported)

                attempt = partial(self._attempt, hub, patience)
                taken = wait_for_release(context, attempt, patience)
            if taken is None:
                raise self._not_taken()
            held = self._holding_now(hub, *taken)
            hub.renewer.register(held.renewal, self.lease_lost)
            self.given.held.add(held.renewal.table_parts, self.key, context.owner)
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
                hub.renewer.unregister(held.renewal)
            keys = [self.key] if context.slots == 1 else self._slot_keys
            hub.drive(handing_back(context, keys))
            if held is not None:
                self._let_go(self.key, released=False)  # handed back, if it could be
            leave_hub(hub)
            raise
        logger.info("acquired lease %s for %g s", self.key, self.settings.ttl)
        note("acquired", lease=self.key)
        if self.records_history:
            try:
                recording = RunRecording(self.context, Alone(self), (LEASE,), None)
                self._recording = recording.__enter__()
                self.last_success = recording.last_success
            except BaseException as error:  # interrupted: give the lease back too
                self.__exit__(type(error), error, error.__traceback__)
                raise
        return self

    def _replace(self, hub: Hub, patience: ConnectPatience) -> tuple[LeaseClock, int | None] | None:
        """Ask the lease's live holder to stop and hand it over, then take it: as soon
        as the holder's work is gone and it handed the row over, else once the row
        expires (a dead or frozen holder); None if neither happened by then."""
        from dislock.core.lease_acquisition import marking, replacing, withdrawing

        context = self.context
        timeout = max(self.settings.interval, 1.0)
        text, marked = hub.drive(marking(context, self.key, timeout, patience))
        if marked is None:  # free by now, or being replaced already
            return self._attempt(hub, patience)
        self._replacing = marked.holder
        try:
            replaced = replacing(context, self.settings, patience, text, marked, given=self.given)
            tried = hub.drive(replaced)
        except BaseException:
            # Interrupted or failed: the holder is not left stopping for nobody.
            hub.drive(withdrawing(context, self.key, text))
            raise
        return self._tried(tried)

    def _attempt(self, hub: Hub, patience: ConnectPatience) -> tuple[LeaseClock, int | None] | None:
        """One try at the lease (or at a free slot of it): its clock and fencing
        token when taken."""
        tries = trying_lease(self.context, self.settings, patience, given=self.given)
        return self._tried(hub.drive(tries))

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

    def _leave(self, held: Held[Hub], *, lost: bool, block_failed: bool) -> None:
        held.hub.renewer.unregister(held.renewal)
        self._held = None
        released = False
        try:
            # A renewal of this lease still in flight runs before the release on
            # the shared connection, and one stuck on a retired connection finds
            # the row expired (renewals skip expired rows): the release stands.
            if not lost and not held.clock.check_deadline(self.given.clock()):
                released = held.hub.drive(
                    releasing(self.context, held.renewal.key, self.settings.ttl)
                )
            elif held.clock.row_gone:
                # Its work is over: a replacer that marked the row takes it now.
                held.hub.drive(handing_over(self.context, held.renewal.key))
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
