"""A key's last slots for the status page's strip: each slot's state, as
``missed_slots.slot_states`` judges it (the judgement ``missed`` and the counts use),
and the duration of the run in it, against the key's runtime envelope.

Computed only for the rows a page shows: ``STRIP_SLOTS`` slots, the window's last and,
for a schedule with fewer in the window, those before it (``EarlierSlots``: a daily
job's month), judged from a read of just those slots' rows (``strip_reads``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import NamedTuple

from dislock.cli.runs.envelope import Envelope, mark
from dislock.cli.runs.missed_slots import (
    ABANDONED,
    DEFAULT_GRACE,
    FAILED,
    Attempt,
    Slot,
    from_first_run,
    slot_indexes,
    slot_states,
)
from dislock.cli.serve.kept_runs import WindowStarts
from dislock.core.cron import EARLY_FIRE_TOLERANCE, slot_start
from dislock.core.cron_zone import recorded_zone
from dislock.core.errors import ConfigurationError

STRIP_SLOTS = 30
"""Slots a strip shows at most: the newest judged (begun a minute ago or more) in the window."""


FAILED_HOW = ("timed_out", "lease_lost", "killed")
"""How a failed slot's last attempt may have ended, shown instead of ``failed``."""


class StripSource(NamedTuple):
    """What one key's strip is computed from, kept by reference until a page asks."""

    slots: Sequence[Slot]
    """The window's last ``STRIP_SLOTS`` slots of the key's schedule (once a page read
    its strip, its last ``STRIP_SLOTS`` however far back: ``strip_reads``)."""
    starts: WindowStarts
    """The scrape's copy, which later scrapes leave alone (or the page's read)."""
    key: str
    ran_before_window: bool
    first_start: datetime
    """The key's latest run's start: where its slots begin when nothing else tells."""
    envelope: Envelope | None
    cron: str | None = None
    """The schedule read, and its zone: a page reads its slots before the window too."""
    cron_tz: str | None = None
    next_slot: datetime | None = None


class StripCell(NamedTuple):
    slot: Slot
    state: str
    """A ``slot_states`` state; a failed slot says how its last attempt ended
    (``timed_out``, ``lease_lost``, ``killed``)."""
    seconds: float | None
    """How long the slot's last attempt took (so far, while running); None: none ran."""
    mark: str | None
    """``slow`` or ``short`` against the envelope."""


def strip_cells(source: StripSource, now: datetime) -> list[StripCell]:
    """The states of the key's last ``STRIP_SLOTS`` slots, oldest first."""
    starts, key = source.starts, source.key
    slots = list(source.slots)
    if not source.ran_before_window:
        # As the counts do: a job new within the window missed nothing before its first run.
        first = starts.of(key) + starts.marks_of(key)
        slots = from_first_run(slots, first or [(source.first_start, None)])
    if not slots:
        return []
    # Only the attempts that may belong to these slots (a start a little early counts).
    since = slots[0].start - timedelta(seconds=EARLY_FIRE_TOLERANCE)
    attempts = [attempt for attempt in starts.attempts_of(key) if attempt.started_at >= since]
    states = slot_states(
        slots,
        attempts,
        now=now,
        **starts.judged_by(key),
    )
    last: dict[int, Attempt] = {}
    found = slot_indexes(slots, [(attempt.started_at, attempt.slot_end) for attempt in attempts])
    for tried, index in zip(attempts, found, strict=True):
        if index >= 0 and (index not in last or tried.started_at > last[index].started_at):
            last[index] = tried
    cells = []
    for index, judged in enumerate(states):
        attempt: Attempt | None = last.get(index) if judged.attempts else None
        state, seconds, marked = judged.state, None, None
        if attempt is not None and state != ABANDONED:
            if state == FAILED and attempt.outcome in FAILED_HOW:
                state = attempt.outcome
            seconds = ((attempt.ended_at or now) - attempt.started_at).total_seconds()
            marked = mark(source.envelope, attempt.outcome or "running", seconds)
        cells.append(StripCell(judged.slot, state, seconds, marked))
    return cells


MAX_STRIP_SPAN = timedelta(days=400)
"""How far back a strip reaches at most: a monthly job shows the slots of 13 months."""

STRIP_BOUNDARY_BUDGET = 1000
"""Cron boundaries one page computes at most for the slots before the window (each
reading's are kept): a key beyond it shows fewer slots until a later view."""


class EarlierSlots:
    """The slots of a schedule before its window's first, back to back, kept by
    (schedule, zone, the window's first slot start): one walk back per reading a day."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, str | None, datetime], list[Slot]] = {}

    def slots(self, source: StripSource, now: datetime, budget: list[int]) -> list[Slot]:
        """``source``'s last ``STRIP_SLOTS`` slots judged (begun a grace ago or more),
        computing at most ``budget[0]`` boundaries (it is decremented)."""
        slots = list(source.slots)
        end = slots[0].start if slots else source.next_slot
        wanted = STRIP_SLOTS - len(slots)
        if wanted <= 0 or end is None or source.cron is None:
            return slots[-STRIP_SLOTS:]
        name = (source.cron, source.cron_tz, end)
        earlier = self._kept.get(name)
        if earlier is None:
            earlier, done = _walk_back(source, end, wanted, now, budget)
            if done:
                if len(self._kept) >= 4 * STRIP_SLOTS:
                    self._kept.clear()  # a schedule's anchor moves on: forget the old ones
                self._kept[name] = earlier
        return earlier + slots


def _walk_back(
    source: StripSource, end: datetime, wanted: int, now: datetime, budget: list[int]
) -> tuple[list[Slot], bool]:
    """Up to ``wanted`` slots ending at ``end`` and before, oldest first; and whether
    the walk is complete (not cut short by the budget)."""
    assert source.cron is not None
    found: list[Slot] = []
    try:
        tz = timezone.utc if source.cron_tz is None else recorded_zone(source.cron_tz)
        while len(found) < wanted:
            if budget[0] <= 0:
                return found[::-1], False
            budget[0] -= 1
            start = slot_start(source.cron, end, tz)
            if start < now - MAX_STRIP_SPAN:
                break
            if start + DEFAULT_GRACE <= now:  # the slot going on now, begun just now: not yet
                found.append(Slot(start, end))
            end = start
    except (ConfigurationError, ValueError):
        pass  # as many as could be read; the window's counts tell of the expression
    return found[::-1], True
