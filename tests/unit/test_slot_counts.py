"""A scrape's counts of a key's slot states (``dislock.cli.serve.slot_counts``) are
``missed_slots.slot_states``' states counted, a failed slot only once it is over: both
are given the same generated histories (runs claimed or started in a slot, late and
held-back marks, pauses, reruns, lease spans, a first run inside the window)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from dislock.cli.runs.missed_slots import (
    FAILED,
    Attempt,
    Slot,
    Span,
    count,
    from_first_run,
    schedule_slots,
    slot_states,
)
from dislock.cli.serve.slot_counts import state_counts
from dislock.core.operator_commands import Pause

NOW = datetime(2026, 12, 4, 12, 0, 30, tzinfo=timezone.utc)
OUTCOMES = ("ok", "failed", "lease_lost", None)


def _instant(rng: random.Random, slots: list[Slot]) -> datetime:
    """An instant somewhere around the window, often right on a slot's edge."""
    slot = rng.choice(slots)
    edge = rng.choice((slot.start, slot.end, slot.start + timedelta(seconds=rng.uniform(-2, 61))))
    return edge + timedelta(microseconds=rng.choice((0, 0, -1, 1)))


def _history(rng: random.Random, slots: list[Slot]) -> dict[str, object]:
    attempts = [
        Attempt(
            _instant(rng, slots),
            rng.choice((None, rng.choice(slots).end, _instant(rng, slots))),
            rng.choice(OUTCOMES),
            running=rng.random() < 0.3,
        )
        for _ in range(rng.randrange(8))
    ]
    ends = [slot.end for slot in slots]

    def some(most: int) -> list[datetime]:
        """Some slots' ends, and now and then an instant that ends no slot."""
        picked = rng.sample(ends, min(len(ends), rng.randrange(most)))
        return picked + [_instant(rng, slots)] * (rng.random() < 0.3)

    spans = []
    for _ in range(rng.randrange(4)):
        start = _instant(rng, slots)
        end = rng.choice(
            (None, _instant(rng, slots), start + timedelta(minutes=rng.uniform(-1, 5)))
        )
        spans.append(Span(start, end))
    pauses = []
    for _ in range(rng.randrange(3)):
        start = _instant(rng, slots)
        pauses.append(Pause(start, start + timedelta(minutes=rng.uniform(0, 4))))
    return {
        "attempts": attempts,
        "late": set(some(3)),
        "held_back": {end: rng.choice(("a", None)) for end in some(3)},
        "reruns": {end: _instant(rng, slots) for end in some(3)},
        "pauses": pauses,
        "spans": spans,
    }


@pytest.mark.parametrize("seed", range(400))
def test_the_counts_are_the_states_counted(seed: int) -> None:
    rng = random.Random(seed)
    since = NOW - timedelta(minutes=rng.randrange(1, 30))
    slots = list(schedule_slots(rng.choice(("* * * * *", "*/3 * * * *")), since, NOW, timedelta(0)))
    now = rng.choice((NOW, rng.choice(slots).end))  # a slot ending right now is over
    given = _history(rng, slots)
    attempts = given.pop("attempts")
    assert isinstance(attempts, list)
    if rng.random() < 0.3:  # a job new within the window
        slots = from_first_run(
            slots, [(attempt.started_at, attempt.slot_end) for attempt in attempts]
        )
    states = slot_states(slots, attempts, now=now, **given)  # type: ignore[arg-type]
    over = [found for found in states if found.state != FAILED or found.slot.end <= now]
    assert state_counts(slots, attempts, now=now, **given) == count(over)  # type: ignore[arg-type]
