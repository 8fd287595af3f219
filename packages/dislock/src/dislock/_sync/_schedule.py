# GENERATED from dislock-aio's dislock/aio/_schedule.py by tools/async_to_sync.py: do not edit.
# Change the asyncio source, then run `hatch run generate`.
"""``ScheduleLock``: one start per schedule slot.

Which slot, and the statements that claim it in which order, are
``dislock.core.schedule_state``'s.
"""

from __future__ import annotations

from datetime import datetime

from dislock.core.after import DependencyPending
from dislock.core.answers import Acquired
from dislock.core.context import LockContext
from dislock.core.exit_arguments import Exc, ExcType, Tb
from dislock.core.kinds import SCHEDULE
from dislock.core.patience import ConnectPatience
from dislock.core.schedule_state import ScheduleState, claiming_schedule_slot, schedule_refusal

from ._hub import GIVEN, drive_briefly, enter_hub
from ._recording import Alone, Run, RunRecording, record_held_back, record_late, run_end
from ._waiting import wait_after


class ScheduleLock(ScheduleState):
    """One start per schedule slot.

    Entering claims the slot's row until ``next_run_time`` (or, without it, until
    the next boundary of ``schedule`` on the database clock) and raises
    ``LockNotAcquiredError`` if another owner already started in this slot, or
    while a key of ``LockContext.after`` has not succeeded in it (waited for with
    ``wait_seconds``: a taken slot never is).  Leaving does nothing: the slot stays
    taken until it ends.  What it knows between statements is
    ``dislock.core.schedule_state.ScheduleState``'s.
    """

    def __init__(self, context: LockContext) -> None:
        super().__init__(context, GIVEN)
        self._recording: RunRecording | None = None
        self.run: Run | None = Alone(None)
        """The run the slot was taken for, whose end decides whether it is retried;
        ``acquire_locks`` gives its session once it has one (None before: a run that
        never started leaves its slot as it is)."""

    def __enter__(self) -> ScheduleLock:
        context = self.context
        try:
            answer, expires_at = self._claim()
        except DependencyPending as pending:
            # Held back by a key it comes after: recorded once per slot, so that the
            # slot does not read as one nobody started (``dislock.core.after``).
            if context.history:
                record_held_back(context, pending)
            raise
        refusal = schedule_refusal(context, answer, expires_at)
        if refusal is not None:
            if answer.began_at is not None and answer.acquired and context.history:
                record_late(context, expires_at)
            raise refusal
        self._took(answer, expires_at)
        if self.records_history:
            recording = RunRecording(context, Alone(None), (SCHEDULE,), expires_at)
            self._recording = recording.__enter__()
            self.last_success = recording.last_success
        return self

    def _claim(self) -> tuple[Acquired, datetime]:
        """The slot's claim and its end, waited for while a key of ``after`` has not
        succeeded in it (with ``wait_seconds``)."""
        context = self.context
        # One patience for every connection on the way to the decision, until the slot ends.
        patience = ConnectPatience(
            context.connect_patience_seconds, self.given.clock(), slot=self._slot_of_now()
        )
        # The connection is given back at once: a slot needs nothing while the job runs.
        with enter_hub(context.url, context.connect_timeout_seconds) as hub:
            hub.connect(patience)

            def claim() -> tuple[Acquired, datetime]:
                claims = claiming_schedule_slot(
                    context, self.key, patience, given=self.given, lease=self.lease_row
                )
                return hub.drive(claims)

            if context.after and context.wait_seconds:
                return wait_after(context, claim, patience)
            return claim()

    @property
    def holding(self) -> bool:
        """Whether the exit has anything to do: a run to record, or with retries a
        failed attempt's slot to reopen (otherwise the slot stays taken until it ends)."""
        return self._recording is not None or self._taken_as is not None

    def __exit__(self, exc_type: ExcType, exc: Exc, tb: Tb) -> None:
        recording, self._recording = self._recording, None
        try:
            if recording is not None:
                recording.__exit__(exc_type, exc, tb)
        finally:
            taken_as, self._taken_as = self._taken_as, None
            if taken_as is not None and self.run is not None:
                end = run_end(self.context, self.run, exc)
                if end.outcome != "ok":
                    drive_briefly(self.context, self._reopening(taken_as, end.outcome))

    def closing(self, exc_type: ExcType, exc: Exc, tb: Tb) -> None:
        """With ``lease_row`` (a holder's vanishing is proven by its lease), before the
        lease is released: a successful attempt marks its slot done, so that a lease
        its wrapper could not release afterwards is not taken for a vanished holder."""
        taken_as = self._taken_as
        if taken_as is None or self.run is None:
            return
        if run_end(self.context, self.run, exc).outcome != "ok":
            return  # reopened, if it may be, as the slot is left (after the lease)
        self._taken_as = None
        drive_briefly(self.context, self._marking_done(taken_as))
