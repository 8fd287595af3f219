"""The process-wide renewer's decisions: which held leases to renew together, and when.

One statement per tick and table renews every lease a process holds on one
database; each lease keeps its own ``LeaseClock`` (docs/design.md, "One connection
and one renewer per database").  Nothing here reads a clock or touches the network.
A run of failures is logged in full once, then as one line with its count, so that
the loss is not buried.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dislock.core.bounds import clip
from dislock.core.lease_clock import LeaseClock
from dislock.core.replace_marks import replaced_by
from dislock.core.rows import forced_mark_of

BATCH_WINDOW_RATIO = 0.5
"""A lease due within half a heartbeat joins a batch that is being sent anyway.
Renewing a little early is harmless (the deadline counts from the send), and it
lines leases up, so that after one round a single statement serves them all."""

RenewalListener = Callable[[Sequence[str], float], None]
"""Told of each batched renewal that succeeded (``benchmarks/scale.py``): the row keys
it renewed and the seconds its statement took."""

renewal_listeners: list[RenewalListener] = []
"""Called by every renewer, sync and asyncio, from its own thread or task: a
listener must be quick.  One that raises is logged and skipped; the renewer goes on."""


@dataclass(eq=False, kw_only=True, slots=True)
class Renewal:
    """One held lease, as the renewer sees it (a dict key: compared by identity)."""

    key: str
    owner: str
    table_parts: tuple[str, ...] = field(repr=False)
    clock: LeaseClock = field(repr=False)
    reported: bool = field(default=False, repr=False)  # its loss is handed out once
    failures: int = field(default=0, repr=False)  # since it was last renewed
    failing_since: float = field(default=0.0, repr=False)  # monotonic
    on_renewed: Callable[[float], None] | None = field(default=None, repr=False)
    """Told the lease's new local deadline after each renewal that succeeded, by
    the renewer itself (for the command's guard): quick, and never raising."""


@dataclass(eq=False, slots=True)
class Batch:
    """The leases of one table renewed by one statement."""

    table_parts: tuple[str, ...]
    renewals: list[Renewal]

    def params(self) -> dict[str, Any]:
        """Parameters of ``LockStatements.renew``: three parallel arrays."""
        return {
            "keys": [r.key for r in self.renewals],
            "owners": [r.owner for r in self.renewals],
            "ttls": [r.clock.settings.ttl for r in self.renewals],
        }

    def timeout(self, now: float) -> float:
        """The most any lease in it allows: one whose deadline comes sooner is declared
        lost on time by the watchdog; cancelling early would cost the others a renewal."""
        return max(r.clock.attempt_timeout(now) for r in self.renewals)


class RenewalPlan:
    """The leases one renewer keeps alive."""

    def __init__(self) -> None:
        # A dict keeps registration order, so batches list leases stably.
        self._renewals: dict[Renewal, None] = {}

    def __len__(self) -> int:
        return len(self._renewals)

    def add(self, renewal: Renewal) -> None:
        self._renewals[renewal] = None

    def remove(self, renewal: Renewal) -> None:
        self._renewals.pop(renewal, None)

    def _live(self) -> Iterable[Renewal]:
        return (r for r in self._renewals if not r.clock.lost)

    def until_next(self, now: float) -> float | None:
        """Seconds until the next renewal is due; None when nothing is left to renew."""
        return min((r.clock.delay_until_renewal(now) for r in self._live()), default=None)

    def until_deadline(self, now: float) -> float | None:
        """Seconds until the earliest local deadline; None when no lease is live."""
        return min((r.clock.until_deadline(now) for r in self._live()), default=None)

    def due(self, now: float) -> list[Batch]:
        """The statements to send now: nothing until some lease is due, then every
        live lease that is due or nearly so, one batch per table."""
        live = list(self._live())
        if not any(r.clock.next_renewal <= now for r in live):
            return []
        batches: dict[tuple[str, ...], list[Renewal]] = {}
        for r in live:
            if r.clock.next_renewal <= now + r.clock.cadence * BATCH_WINDOW_RATIO:
                batches.setdefault(r.table_parts, []).append(r)
        return [Batch(table, renewals) for table, renewals in batches.items()]

    def settle(
        self, batch: Batch, *, sent_at: float, now: float, renewed: Iterable[tuple[str, str]]
    ) -> list[Renewal]:
        """Record a batch's answer (the ``(key, owner)`` pairs it renewed); returns
        the leases lost by it."""
        renewed = set(renewed)
        for r in batch.renewals:
            if r in self._renewals:
                rows = 1 if (r.key, r.owner) in renewed else 0
                r.clock.renewed(sent_at=sent_at, now=now, rows=rows)
        return self._newly_lost(batch.renewals)

    def failed(self, batch: Batch, error: BaseException | str, *, now: float) -> list[Renewal]:
        """Record a batch that raised (``error`` as ``LeaseClock.failed`` takes it);
        returns the leases whose deadline it passed."""
        for r in batch.renewals:
            if r in self._renewals:
                r.clock.failed(error, now=now)
        return self._newly_lost(batch.renewals)

    def check_deadlines(self, now: float) -> list[Renewal]:
        """Record the loss of each lease whose local deadline has passed."""
        for r in self._renewals:
            r.clock.check_deadline(now)
        return self._newly_lost(self._renewals)

    def _newly_lost(self, renewals: Iterable[Renewal]) -> list[Renewal]:
        lost = []
        for r in renewals:
            if r.clock.lost and not r.reported and r in self._renewals:
                r.reported = True
                lost.append(r)
        return lost


def count_failure(batch: Batch, now: float) -> bool:
    """Count a failed attempt for each lease of ``batch`` (not one lost meanwhile,
    whose failures were summed up with its loss); whether it is the first failure of
    any of them since it was last renewed: the one to log in full."""
    first = False
    for r in batch.renewals:
        if r.clock.lost:
            continue
        if r.failures == 0:
            first = True
            r.failing_since = now
        r.failures += 1
    return first


def recovery_summary(batch: Batch, now: float) -> str | None:
    """Once ``batch`` was renewed: the line saying its leases' failures are over
    (None when none had failed)."""
    failed = [r for r in batch.renewals if r.failures]
    if not failed:
        return None
    count = max(r.failures for r in failed)
    seconds = now - min(r.failing_since for r in failed)
    for r in failed:
        r.failures = 0
    leases = f"lease {failed[0].key}" if len(failed) == 1 else f"{len(failed)} leases"
    return (
        f"renewal of {leases} succeeded again after {count} failed attempt(s) over {seconds:.1f} s"
    )


def failure_summary(renewal: Renewal, now: float) -> str | None:
    """When ``renewal`` is lost: how many attempts failed before (None for one or none)."""
    count, renewal.failures = renewal.failures, 0
    if count < 2:
        return None
    seconds = now - renewal.failing_since
    return f"renewal of lease {renewal.key} failed {count} times over {seconds:.1f} s"


EXPLAIN_TIMEOUT = 0.5
"""How long the read that says why leases were found gone may delay their loss."""


def gone(lost: Iterable[Renewal]) -> list[Renewal]:
    """The leases among ``lost`` that a renewal found no longer theirs."""
    return [r for r in lost if r.clock.row_gone]


def explain(renewals: Iterable[Renewal], values: dict[str, str]) -> None:
    """Give each of ``renewals`` whose row (``values``, by key) was marked by a
    replacer (``dislock.core.replace_marks``), or released by ``dislockctl release``,
    the reason that says so, and by whom."""
    for r in renewals:
        value = values.get(r.key)
        forced = None if value is None else forced_mark_of(value)
        released = None
        if forced is not None and forced[0] == r.owner:
            released = "released by dislockctl" + (f" as {clip(forced[1])}" if forced[1] else "")
        r.clock.replaced(replaced_by(r.owner, value), released)


def new_deadlines(batch: Batch) -> list[tuple[Callable[[float], None], float]]:
    """The ``on_renewed`` calls a batch that succeeded makes."""
    return [
        (r.on_renewed, r.clock.deadline)
        for r in batch.renewals
        if r.on_renewed is not None and not r.clock.lost
    ]


def report_renewal(batch: Batch, seconds: float) -> None:
    """Tell ``renewal_listeners`` of a batch that succeeded (its leases still held)."""
    if not renewal_listeners:
        return
    keys = [r.key for r in batch.renewals if not r.clock.lost]
    for listener in tuple(renewal_listeners):
        try:
            listener(keys, seconds)
        except Exception:
            logging.getLogger(__name__).exception("a renewal listener raised")
