# GENERATED from dislock-aio's dislock/aio/_renewer.py by tools/async_to_sync.py: do not edit.
# Change the asyncio source, then run `hatch run generate`.
"""The renewer and the watchdog of one hub's leases (``Renewer``).

Leases register with it; its renewer renews all of them with one statement per
tick and table (see ``dislock.core.renewal``) on the hub's connection, and its
watchdog declares each lease lost at its own local deadline, even while a
renewal hangs on a dead network.
"""

from __future__ import annotations

import logging
import math
import threading
from functools import partial
from time import monotonic
from typing import TYPE_CHECKING

from dislock.core.dsn import error_line
from dislock.core.lock_statements import statements
from dislock.core.renewal import (
    EXPLAIN_TIMEOUT,
    Batch,
    Renewal,
    RenewalPlan,
    count_failure,
    explain,
    failure_summary,
    gone,
    new_deadlines,
    recovery_summary,
    report_renewal,
)
from dislock.core.replace_marks import values
from dislock.core.supervision import LOSS_LOGGER
from dislock.core.timeouts import CANCEL_GRACE, RENEWER_STOP_TIMEOUT

from ._compat import Event, Worker, spawn, stop_worker, wait_event

if TYPE_CHECKING:
    from ._hub import Hub

logger = logging.getLogger("dislock")
loss_logger = logging.getLogger(LOSS_LOGGER)


def _sleep_for(wait: float | None, planned: float, now: float) -> float | None:
    """How long a worker sleeps: ``wait``, until its next job, or, with none left,
    until the wake it had already planned, so that a short lock's whole life before
    then wakes nothing (``Renewer.register`` wakes a worker sleeping for ever)."""
    if wait is None and now < planned < math.inf:
        return planned - now
    return wait


def _leases(batch: Batch) -> str:
    renewals = batch.renewals
    return f"lease {renewals[0].key}" if len(renewals) == 1 else f"{len(renewals)} leases"


class Renewer:
    """The renewer and the watchdog of one hub's leases (see the module); the
    watchdog also replaces a renewer stuck in a statement.  Both live as long as
    the hub, so that taking and releasing leases starts no worker each time.
    Everything they share with each other and with the locks' threads is under
    ``_guard``, which is never held across I/O or a wait."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self._guard = threading.Lock()
        # Under the guard:
        self.plan = RenewalPlan()
        self._lost_events: dict[Renewal, Event] = {}
        self._renewer: Worker | None = None
        self._watchdog: Worker | None = None
        self._abandoned: list[Worker] = []
        self._generation = 0
        self._closing = False
        self._renewer_wakes_at = math.inf
        self._watchdog_wakes_at = math.inf
        self._sending_since: float | None = None
        self._sending_for = 0.0
        # Events are safe to set from any thread (and wake their waiters).
        self._renew_wake = Event()
        self._watch_wake = Event()

    def holds_leases(self) -> bool:
        with self._guard:
            return bool(len(self.plan))

    def register(self, renewal: Renewal, lost: Event) -> None:
        """Keep ``renewal`` alive until ``unregister``; set ``lost`` if it cannot be."""
        with self._guard:
            self._lost_events[renewal] = lost
            self.plan.add(renewal)
            if self._renewer is None:
                self._start_renewer()
            if self._watchdog is None:
                self._watchdog = spawn(self._watch, "dislock-deadline")
            # Wake a worker only if it would sleep past what this lease needs:
            # waking threads costs more than the statements of a short lock.
            wake_renewer = renewal.clock.next_renewal < self._renewer_wakes_at
            wake_watchdog = renewal.clock.deadline < self._watchdog_wakes_at
            # A woken worker that finds the lease already gone (released before it
            # ran) keeps sleeping until then, not for ever (``_sleep_for``), so that
            # the next short lock does not wake it again.
            self._renewer_wakes_at = min(self._renewer_wakes_at, renewal.clock.next_renewal)
            self._watchdog_wakes_at = min(self._watchdog_wakes_at, renewal.clock.deadline)
        if wake_renewer:
            self._renew_wake.set()
        if wake_watchdog:
            self._watch_wake.set()

    def unregister(self, renewal: Renewal) -> None:
        # The workers find out when they next wake; nothing is due sooner.
        with self._guard:
            self.plan.remove(renewal)
            self._lost_events.pop(renewal, None)

    def declare_lost(self, renewal: Renewal) -> None:
        """Set the loss event of ``renewal`` (lost by its clock), logging the
        reason once; nothing once it is unregistered, so that a late verdict on
        one acquisition never reaches the next one of the same lock."""
        summary = None
        with self._guard:
            event = self._lost_events.get(renewal)
            newly = event is not None and not event.is_set()
            if newly:
                assert event is not None
                event.set()
                summary = failure_summary(renewal, monotonic())
        if summary is not None:
            logger.warning("%s", summary)
        if newly:
            loss_logger.warning("lease %s lost: %s", renewal.key, renewal.clock.lost_reason)

    def _start_renewer(self) -> None:
        """(Under the guard.)"""
        self._generation += 1
        self._renewer = spawn(partial(self._renew, self._generation), "dislock-renewer")

    def _renew(self, generation: int) -> None:
        """Send the due batches, then sleep until the next lease is due (or for
        ever, without leases; ``register`` wakes it)."""
        while True:
            self._renew_wake.clear()
            with self._guard:
                if generation != self._generation:
                    return
                now = monotonic()
                wait = self.plan.until_next(now)
                batches = self.plan.due(now)
                if not batches:
                    wait = _sleep_for(wait, self._renewer_wakes_at, now)
                    self._renewer_wakes_at = math.inf if wait is None else now + wait
            if not batches:
                wait_event(self._renew_wake, wait)
                continue
            for batch in batches:
                self._send(batch, generation)

    def _send(self, batch: Batch, generation: int) -> None:
        renew = statements(batch.table_parts).renew(batch)
        sent_at = monotonic()
        timeout = batch.timeout(sent_at)
        with self._guard:
            self._sending_since, self._sending_for = sent_at, timeout
        try:
            renewed = self.hub.ask(renew, timeout)
        except Exception as exc:
            detail = error_line(exc, self.hub.url)  # kept as the lease's last_error too
            with self._guard:
                if generation != self._generation:
                    return  # replaced while stuck: its successor keeps the books now
                now = monotonic()
                # Counted before the failure is recorded, which may lose the lease.
                first = count_failure(batch, now)
                lost = self.plan.failed(batch, detail, now=now)
                self._sending_since = None
            # The first failure in full; the rest are counted, and summed up in one
            # line once renewals succeed again or the lease is lost.
            logger.log(
                logging.WARNING if first else logging.DEBUG,
                "renewal of %s failed, retrying until %s: %s",
                _leases(batch),
                "its deadline" if len(batch.renewals) == 1 else "their deadlines",
                detail,
            )
        else:
            with self._guard:
                if generation != self._generation:
                    return
                now = monotonic()
                lost = self.plan.settle(batch, sent_at=sent_at, now=now, renewed=renewed)
                recovered = recovery_summary(batch, now)
                self._sending_since = None
                followers = new_deadlines(batch)
            for follow, deadline in followers:
                follow(deadline)
            if recovered is not None:
                logger.warning("%s", recovered)
            took = monotonic() - sent_at
            logger.debug("renewed %s in %.1f ms", _leases(batch), took * 1000)
            report_renewal(batch, took)
            found_gone = gone(lost)
            if found_gone:
                self._explain(batch, found_gone)
        for renewal in lost:
            self.declare_lost(renewal)

    def _explain(self, batch: Batch, renewals: list[Renewal]) -> None:
        """Read the rows of ``renewals``, found gone, to say why they were lost: a
        replacer that asked for one is named in its loss.  Briefly: the loss waits."""
        with self._guard:
            # Watched as a renewal is: one stuck on a dead network is replaced.
            self._sending_since, self._sending_for = monotonic(), EXPLAIN_TIMEOUT
        try:
            found = self.hub.ask(
                values(batch.table_parts, [r.key for r in renewals]), EXPLAIN_TIMEOUT
            )
        except Exception as exc:
            logger.debug("reading why leases were lost failed: %s", error_line(exc, self.hub.url))
            return
        finally:
            with self._guard:
                self._sending_since = None
        with self._guard:
            explain(renewals, found)

    def _watch(self) -> None:
        """Declare leases lost at their deadlines, and replace a renewer stuck in a
        statement its cancellation could not end (a dead network can swallow both)."""
        while True:
            self._watch_wake.clear()
            with self._guard:
                if self._closing:
                    return
                now = monotonic()
                lost = self.plan.check_deadlines(now)
                wait = self.plan.until_deadline(now)
                since = self._sending_since
                if since is not None:
                    stuck_at = since + self._sending_for + CANCEL_GRACE
                    if now >= stuck_at:
                        self._replace_stuck_renewer()
                    else:
                        wait = stuck_at - now if wait is None else min(wait, stuck_at - now)
                wait = _sleep_for(wait, self._watchdog_wakes_at, now)
                self._watchdog_wakes_at = math.inf if wait is None else now + wait
            for renewal in lost:
                self.declare_lost(renewal)
            wait_event(self._watch_wake, wait)

    def _replace_stuck_renewer(self) -> None:
        """(Under the guard.)"""
        logger.warning("the lease renewer is stuck in a statement; starting another")
        self._sending_since = None
        if self._renewer is not None:
            self._abandoned.append(self._renewer)
        # Its connection is overdue, so the next statement retires it and opens
        # another; the stuck statement closes it if it ever returns.
        self._start_renewer()

    def stop(self) -> None:
        """End the renewer and the watchdog and wait for them; a worker stuck in a
        statement is left behind."""
        with self._guard:
            self._closing = True
            self._generation += 1
            workers = (self._renewer, self._watchdog, *self._abandoned)
            self._renewer = self._watchdog = None
            self._abandoned = []
        self._renew_wake.set()
        self._watch_wake.set()
        for worker in workers:
            if worker is not None:
                stop_worker(worker, RENEWER_STOP_TIMEOUT)
