"""A key's last slots for the status page's strip: each slot's state, as
``missed_slots.slot_states`` judges it (the judgement ``missed`` and the counts use),
and the duration of the run in it, against the key's runtime envelope.

Computed only for the rows a page shows, from what the scrape read anyway (the window's
slots and ``WindowStarts``): ``STRIP_SLOTS`` slots and the attempts in them, never a
read of the database nor a walk of the whole window.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from dislock.cli.runs.envelope import Envelope, mark
from dislock.cli.runs.missed_slots import (
    ABANDONED,
    FAILED,
    Attempt,
    Slot,
    from_first_run,
    slot_indexes,
    slot_states,
)
from dislock.cli.serve.kept_runs import WindowStarts
from dislock.core.after import HELD_BACK
from dislock.core.cron import EARLY_FIRE_TOLERANCE

STRIP_SLOTS = 30
"""Slots a strip shows at most: the newest judged (begun a minute ago or more) in the window."""


FAILED_HOW = ("timed_out", "lease_lost", "killed")
"""How a failed slot's last attempt may have ended, shown instead of ``failed``."""


class StripSource(NamedTuple):
    """What one key's strip is computed from, kept by reference until a page asks."""

    slots: Sequence[Slot]
    """The window's last ``STRIP_SLOTS`` slots of the key's schedule."""
    starts: WindowStarts
    """The scrape's copy, which later scrapes leave alone."""
    key: str
    ran_before_window: bool
    first_start: datetime
    """The key's latest run's start: where its slots begin when nothing else tells."""
    envelope: Envelope | None


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
        late=starts.late_of(key),
        held_back=dict.fromkeys(starts.late_of(key, HELD_BACK)),
        pauses=starts.pauses_of(key),
        spans=starts.spans_of(key),
        reruns=starts.reruns_of(key),
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
