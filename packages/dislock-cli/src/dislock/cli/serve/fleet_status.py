"""What ``dislockctl serve`` knows about a fleet at one moment: one ``KeyStatus`` per
lock key, built from one snapshot of the lock table and the run history
(``build_snapshot``).  Plain data."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import NamedTuple

from dislock.cli.admin import MODES, shown_owner
from dislock.cli.lock_rows import RUNNING, SLOT_TAKEN, WAITING, LockRow, waiting_for_group
from dislock.cli.runs.envelope import Envelope, mark
from dislock.cli.runs.run_history import Latest
from dislock.cli.serve.scrape import RunDetails
from dislock.cli.serve.slot_strip import StripSource
from dislock.core.kinds import GROUP

MISSED_WINDOW = timedelta(hours=24)
"""The slot counts are of the slots of the key's schedule that began in the last 24
hours (and at least a minute ago), judged as ``dislockctl missed KEY --since 24h``
judges them (``dislock.cli.runs.missed_slots``); each metric's help says which."""

FAILED_OUTCOMES = ("failed", "lease_lost", "killed", "timed_out", "abandoned")
"""Outcomes a person must look at; the status page lists these first."""


class HeldLock(NamedTuple):
    """One row of the lock table, as the page and ``dislock_lock_held`` see it."""

    mode: str
    """``schedule`` or ``lease``."""
    owner: str
    """As ``dislockctl ls`` shows it (``dislock.cli.admin.shown_owner``)."""
    state: str
    """As ``dislockctl ls`` says it (``LockRow.state``)."""
    seconds_left: float
    """Until it expires (negative: since it did)."""
    forced: bool = False
    released_by: str = ""
    """Who ``dislockctl release`` released it as (``ROLE on HOST``), when it said."""
    activity: str | None = None
    """A held row's ``LockRow.activity``: running, slot taken or waiting for group."""


class LastRun(NamedTuple):
    owner: str
    host: str
    started_at: datetime
    outcome: str
    """One of ``dislock.core.history.OUTCOMES``, or ``running`` or ``abandoned``."""
    exit_code: int | None
    duration_seconds: float | None
    output: tuple[str | None, str | None] | None = None
    """The end of its stdout and stderr, kept for a failed run."""
    envelope: Envelope | None = None
    """Its key's envelope, of the successful runs before it (None: too few)."""

    @property
    def mark(self) -> str | None:
        """``slow`` (a running one: so far) or ``short`` against ``envelope``."""
        return mark(self.envelope, self.outcome, self.duration_seconds)


class KeyStatus(NamedTuple):
    """Everything known about one lock key at one moment."""

    lock_key: str
    locks: tuple[HeldLock, ...] = ()
    paused_until: datetime | None = None
    pause_reason: str | None = None
    last_run: LastRun | None = None
    last_success_at: datetime | None = None
    runs_total: Mapping[str, int] = {}
    schedule: str | None = None
    next_slot: datetime | None = None
    missed_slots: int | None = None
    """Slots in the window nobody ran in, late and held-back ones included (None: no
    schedule known); each other count as ``dislock.cli.serve.metrics`` says."""
    covered_slots: int | None = None
    failed_slots: int | None = None
    late_slots: int | None = None
    held_back_slots: int | None = None
    paused_slots: int | None = None

    @property
    def state(self) -> str:
        """A word or two for the page: paused wins, then running (a lease's run, or the
        history's), waiting for group, slot taken (nothing runs in it), then how it was
        let go."""
        if self.paused_until is not None:
            return "paused"
        if self.last_run is not None and self.last_run.outcome == RUNNING:
            return RUNNING
        states = {lock.activity or lock.state for lock in self.locks}
        order = (RUNNING, WAITING, SLOT_TAKEN, "held", "expired", "released", "ended")
        return next((s for s in order if s in states), "free")

    @property
    def failing(self) -> bool:
        return self.last_run is not None and self.last_run.outcome in FAILED_OUTCOMES


class GroupStatus(NamedTuple):
    """A group (``LOCK_GROUP=NAME:N``) as the page and ``dislock_group_held`` see it: its N
    is each member's own setting, in no row."""

    name: str
    holders: tuple[str, ...] = ()
    """The owners of its held slots, as ``dislockctl ls`` shows them."""

    @property
    def held(self) -> int:
        return len(self.holders)


def group_statuses(lock_rows: Iterable[LockRow]) -> tuple[GroupStatus, ...]:
    """Each group with a slot held, or a slot row that ended in the last ``MISSED_WINDOW``."""
    window = MISSED_WINDOW.total_seconds()
    groups: dict[str, list[str]] = {}
    for row in lock_rows:
        if row.mode != GROUP.name or row.expires_in_seconds <= -window:
            continue
        holders = groups.setdefault(row.lock_key, [])
        if row.held:
            holders.append(shown_owner(row.owner, row.expire_at, row.expires_in_seconds))
    return tuple(GroupStatus(name, tuple(holders)) for name, holders in sorted(groups.items()))


class FleetSnapshot(NamedTuple):
    """The fleet at ``now`` (database clock); without ``up``, ``keys`` is empty."""

    now: datetime
    up: bool
    keys: tuple[KeyStatus, ...] = ()
    lock_delay_end: datetime | None = None
    """While a lock delay after a database failover runs, when it ends."""
    grant_loopholes: int = 0
    groups: tuple[GroupStatus, ...] = ()
    strips: Mapping[str, StripSource] = {}
    """What each key's slot strip is computed from, for the rows a page shows."""


class LatestRow(NamedTuple):
    """A key's latest run: ``run_history.latest``'s row completed by
    ``ScrapeStatements.run_details``."""

    run: Latest
    more: RunDetails
    envelope: Envelope | None = None


def _last_run(row: LatestRow, now: datetime) -> LastRun:
    run, more = row.run, row.more
    assert run.started_at is not None and run.outcome is not None  # it ran
    duration = run.duration_seconds  # None while it runs, or once abandoned
    if run.outcome == "running":
        duration = max(0.0, (now - run.started_at).total_seconds())
    output = (more.stdout_tail, more.stderr_tail)
    return LastRun(
        more.owner,
        run.host or "",
        run.started_at,
        run.outcome,
        more.exit_code,
        duration,
        output if any(output) else None,
        row.envelope,
    )


def _schedule_text(more: RunDetails) -> str | None:
    # No zone recorded: UTC, from before zones were.
    if more.cron is None or more.cron_tz in (None, "UTC"):
        return more.cron
    return f"{more.cron} ({more.cron_tz})"


def build_snapshot(
    now: datetime,
    lock_rows: Iterable[LockRow],
    latest: Iterable[LatestRow],
    *,
    runs_total: Mapping[str, Mapping[str, int]],
    slot_counts: Mapping[str, Mapping[str, int]],
    next_slots: Mapping[str, datetime],
    timeline_expire_at: datetime | None,
    grant_loopholes: int,
) -> FleetSnapshot:
    """One ``KeyStatus`` per key found in the lock table or the history; ``slot_counts``:
    per key with a schedule, its slots in the window by state."""
    lock_rows = sorted(lock_rows, key=lambda lock: lock.mode != "schedule")  # schedule first
    runs = {row.run.key: row for row in latest}
    waiting = waiting_for_group(lock_rows, lambda lock: _unstarted(runs.get(lock.lock_key), lock))
    locks: dict[str, list[HeldLock]] = {}
    pauses: dict[str, tuple[str, datetime]] = {}
    for lock in lock_rows:
        if lock.mode == "pause":
            if lock.expires_in_seconds > 0:
                pauses[lock.lock_key] = (lock.owner, lock.expire_at)
            continue
        if lock.mode not in MODES:
            continue  # a kind of row this version does not know: not ours to judge
        left = lock.expires_in_seconds
        owner = shown_owner(lock.owner, lock.expire_at, left)
        by = lock.released_by or ""
        held = HeldLock(lock.mode, owner, lock.state, left, lock.forced, by, lock.activity(waiting))
        locks.setdefault(lock.lock_key, []).append(held)
    statuses = []
    for lock_key in sorted(set(locks) | set(runs) | set(pauses)):
        row = runs.get(lock_key)
        reason, until = pauses.get(lock_key, (None, None))
        statuses.append(
            KeyStatus(
                lock_key,
                locks=tuple(locks.get(lock_key, ())),
                paused_until=until,
                pause_reason=reason or None,
                last_run=_last_run(row, now) if row else None,
                last_success_at=row.run.last_success_ended_at if row else None,
                runs_total=dict(runs_total.get(lock_key, {})),
                schedule=_schedule_text(row.more) if row else None,
                next_slot=next_slots.get(lock_key),
                **_slot_counts(slot_counts.get(lock_key)),
            )
        )
    delay_end = lock_delay_end(timeline_expire_at, now)
    groups = group_statuses(lock_rows)
    return FleetSnapshot(now, True, tuple(statuses), delay_end, grant_loopholes, groups)


def _unstarted(row: LatestRow | None, lock: LockRow) -> bool:
    """Whether the key of ``lock`` records its runs, and the newest is not its owner's
    still going (``dislock.cli.lock_rows.waiting_for_group``)."""
    if row is None or row.run.run_id is None:
        return False
    return not (row.run.outcome == RUNNING and row.more.owner == lock.owner)


def _slot_counts(counts: Mapping[str, int] | None) -> dict[str, int]:
    """A key's ``*_slots`` fields (none without a schedule known)."""
    if counts is None:
        return {}
    kept = ("covered", "failed", "late", "held_back", "paused")
    # Late and held-back slots are slots nobody started too: counted apart as well.
    missed = counts["missed"] + counts["late"] + counts["held_back"]
    return {"missed_slots": missed, **{f"{state}_slots": counts[state] for state in kept}}


def lock_delay_end(expire_at: datetime | None, now: datetime) -> datetime | None:
    """``FleetSnapshot.lock_delay_end`` from the timeline row's ``expire_at``."""
    return expire_at if expire_at is not None and expire_at > now else None
