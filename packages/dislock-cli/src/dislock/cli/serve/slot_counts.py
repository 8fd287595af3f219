"""How many of a key's slots are in each state, as a scrape counts them:
``missed_slots.slot_states`` counted, without a state built for every slot.

A day of an every-minute job is 1,440 slots, nearly all alike (missed, or covered by a
lease run still going): only the slots that a run began in, or that a mark, a pause or
a rerun names, are judged one by one (``missed_slots.judged``); the others are counted
by bisection.  ``tests/unit/test_slot_counts.py`` holds both to one answer.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime

from dislock.cli.runs.missed_slots import (
    COVERED,
    FAILED,
    MISSED,
    STATES,
    Attempt,
    Slot,
    SlotMarks,
    Span,
    end_of,
    judged,
    merged_spans,
    slot_indexes,
    start_of,
)
from dislock.core.operator_commands import Pause


def state_counts(
    slots: Sequence[Slot],
    attempts: Sequence[Attempt],
    *,
    now: datetime,
    late: Collection[datetime] = (),
    pauses: Sequence[Pause] = (),
    spans: Sequence[Span] = (),
    reruns: Mapping[datetime, datetime] | None = None,
    held_back: Mapping[datetime, str | None] | None = None,
) -> dict[str, int]:
    """How many of ``slots`` ``slot_states`` puts in each state (every state, zeros
    included), a failed slot only once it is over (a retry may still come before)."""
    marks = SlotMarks(late, pauses, None, reruns or {}, held_back or {})
    begun: dict[int, list[Attempt]] = {}
    starts = [(attempt.started_at, attempt.slot_end) for attempt in attempts]
    for attempt, index in zip(attempts, slot_indexes(slots, starts), strict=True):
        if index >= 0:
            begun.setdefault(index, []).append(attempt)
    named = [*marks.late, *marks.held_back, *marks.reruns]
    judging = set(begun) | _ending_at(slots, named) | _paused(slots, pauses)
    merged = merged_spans(spans)
    counts = dict.fromkeys(STATES, 0)
    for index in judging:
        slot = slots[index]
        found = judged(slot, begun.get(index, []), now, marks)
        if found is None:
            counts[COVERED if _covered(slot.start, merged) else MISSED] += 1
        elif found.state != FAILED or slot.end <= now:
            counts[found.state] += 1
    # The others: covered when their start falls inside a merged span, else missed.
    inside = sum(_starting_inside(slots, span) for span in merged)
    covered = inside - sum(_covered(slots[index].start, merged) for index in judging)
    counts[COVERED] += covered
    counts[MISSED] += len(slots) - len(judging) - covered
    return counts


def _ending_at(slots: Sequence[Slot], ends: Sequence[datetime]) -> set[int]:
    found = set()
    for end in ends:
        index = bisect_left(slots, end, key=end_of)
        if index < len(slots) and slots[index].end == end:
            found.add(index)
    return found


def _paused(slots: Sequence[Slot], pauses: Sequence[Pause]) -> set[int]:
    """The slots whose start a pause covers (``Pause.covers``)."""
    found: set[int] = set()
    for pause in pauses:
        low = bisect_left(slots, pause.start, key=start_of)
        found.update(range(low, bisect_left(slots, pause.end, key=start_of)))
    return found


def _covered(start: datetime, merged: Sequence[Span]) -> bool:
    """Whether the last merged span begun before ``start`` still went on at it (as
    ``split_covered`` judges a slot)."""
    index = bisect_left(merged, start, key=start_of) - 1
    end = merged[index].end if index >= 0 else start
    return index >= 0 and (end is None or end > start)


def _starting_inside(slots: Sequence[Slot], span: Span) -> int:
    """How many slots start after ``span`` began and before it ended."""
    low = bisect_right(slots, span.start, key=start_of)
    high = len(slots) if span.end is None else bisect_left(slots, span.end, key=start_of)
    return max(0, high - low)
