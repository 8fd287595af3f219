"""What became of each slot of a key's schedule, from its recorded runs and events.

``dislockctl missed`` lists the states and ``serve`` counts them; docs/operator.md
("missed") says what each state means.  ``TO_LOOK_AT`` are the ones someone should
look at; the others are the lock working, an operator's choice, or not known yet.  A
slot a ``dislockctl rerun`` reopened is judged by the attempts after the rerun only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import NamedTuple

from dislock.cli.runs.missed_slots import Slot, Span, slot_indexes, split_covered
from dislock.core.operator_commands import Pause

DONE = "done"
RUNNING = "running"
RETRYING = "retrying"
FAILED = "failed"
ABANDONED = "abandoned"
LATE = "late"
HELD_BACK = "held_back"
PAUSED = "paused"
COVERED = "covered"
MISSED = "missed"
STATES = (DONE, RUNNING, RETRYING, FAILED, ABANDONED, HELD_BACK, LATE, PAUSED, COVERED, MISSED)
TO_LOOK_AT = (MISSED, HELD_BACK, LATE, FAILED)
"""The states ``dislockctl missed`` lists by default and exits 1 for."""


class Attempt(NamedTuple):
    """A run of the job as the history recorded it."""

    started_at: datetime
    slot_end: datetime | None
    """The end of the slot it claimed (a schedule lock); None for a lease alone."""
    outcome: str | None
    running: bool = False
    """No end recorded and it still holds its lock (otherwise it was abandoned)."""


class SlotState(NamedTuple):
    slot: Slot
    state: str
    attempts: int
    waiting_for: str | None = None
    """``held_back``: the key the slot waited for."""

    def as_json(self) -> dict[str, object]:
        found: dict[str, object] = {
            **self.slot.as_json(),
            "state": self.state,
            "attempts": self.attempts,
        }
        if self.waiting_for is not None:
            found["waiting_for"] = self.waiting_for
        return found

    def described(self) -> str:
        """The state as ``missed`` prints it: a held-back slot names its key."""
        if self.state == HELD_BACK and self.waiting_for is not None:
            return f"held back (waiting for {self.waiting_for!r})"
        return self.state.replace("_", " ")


def attempts_by_slot(slots: Sequence[Slot], attempts: Sequence[Attempt]) -> list[list[Attempt]]:
    """Each slot's attempts (``dislock.cli.runs.missed_slots.slot_indexes``)."""
    found: list[list[Attempt]] = [[] for _ in slots]
    starts = [(attempt.started_at, attempt.slot_end) for attempt in attempts]
    for attempt, index in zip(attempts, slot_indexes(slots, starts), strict=True):
        if index >= 0:
            found[index].append(attempt)
    return found


def slot_states(
    slots: Sequence[Slot],
    attempts: Sequence[Attempt],
    *,
    now: datetime,
    late: Collection[datetime] = (),
    pauses: Sequence[Pause] = (),
    spans: Sequence[Span] = (),
    retrying: datetime | None = None,
    reruns: Mapping[datetime, datetime] | None = None,
    held_back: Mapping[datetime, str | None] | None = None,
) -> list[SlotState]:
    """The state of each of ``slots`` (in order).  ``late`` and ``held_back`` (with the
    key waited for): the ends of slots so marked; ``spans``: the lease runs'
    (``split_covered``); ``retrying``: the end of the slot whose row waits for another
    attempt; ``reruns``: when each slot (by its end) was last reopened."""
    states: dict[int, SlotState] = {}
    unstarted: list[Slot] = []
    for index, (slot, tried) in enumerate(
        zip(slots, attempts_by_slot(slots, attempts), strict=True)
    ):
        rerun = (reruns or {}).get(slot.end)
        if rerun is not None:
            # What the operator asked for is the run after the rerun.
            tried = [attempt for attempt in tried if attempt.started_at > rerun]
        if tried:
            states[index] = SlotState(slot, _tried(slot, tried, now, retrying), len(tried))
        elif retrying == slot.end and slot.end > now:
            states[index] = SlotState(slot, RETRYING, 0)  # a rerun not taken yet
        elif any(pause.covers(slot.start) for pause in pauses):
            # Paused wins over a late mark: the first wrapper after a resume marks a
            # slot paused past its deadline late, which was the pause's doing.
            states[index] = SlotState(slot, PAUSED, 0)
        elif held_back and slot.end in held_back:
            # Before a late mark: waiting for the key is why it was not started in time.
            states[index] = SlotState(slot, HELD_BACK, 0, held_back[slot.end])
        elif slot.end in late:
            states[index] = SlotState(slot, LATE, 0)
        else:
            unstarted.append(slot)
    _, covered = split_covered(unstarted, spans)
    covered_ends = {slot.end for slot in covered}
    return [
        states.get(index) or SlotState(slot, COVERED if slot.end in covered_ends else MISSED, 0)
        for index, slot in enumerate(slots)
    ]


def _tried(slot: Slot, tried: Sequence[Attempt], now: datetime, retrying: datetime | None) -> str:
    if any(attempt.outcome == "ok" for attempt in tried):
        return DONE
    if any(attempt.outcome is None and attempt.running for attempt in tried):
        return RUNNING
    if retrying == slot.end and slot.end > now:
        return RETRYING
    last = max(tried, key=lambda attempt: attempt.started_at)
    return ABANDONED if last.outcome is None else FAILED


def count(states: Sequence[SlotState]) -> dict[str, int]:
    """How many slots are in each state (every state, zeros included)."""
    counts = dict.fromkeys(STATES, 0)
    for found in states:
        counts[found.state] += 1
    return counts
