"""What became of each slot (``dislock.cli.runs.missed_slots.slot_states``) and a key's pauses
(``dislock.core.operator_commands.pause_spans``), without a database."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from dislock.cli.runs.missed_slots import Attempt, Slot, Span, count, schedule_slots, slot_states
from dislock.core.operator_commands import PAUSED, RERUN, RESUMED, Event, Pause, pause_spans, reruns
from dislock.core.pause import UNTIL_RESUMED

NOW = datetime(2026, 12, 4, 12, 0, 30, tzinfo=timezone.utc)
SECOND = timedelta(seconds=1)


def minutes(count: int) -> list[Slot]:
    """The minute slots of the last ``count`` minutes, oldest first (the last is
    the current one, not over yet)."""
    since = NOW.replace(second=0) - timedelta(minutes=count - 1)
    return list(schedule_slots("* * * * *", since, NOW, timedelta(0)))


def states_of(slots: list[Slot], **given: object) -> list[str]:
    return [found.state for found in slot_states(slots, now=NOW, **given)]  # type: ignore[arg-type]


def test_each_state_from_the_runs_in_its_slot() -> None:
    slots = minutes(8)
    attempts = [
        # 0: failed, then done on the second attempt (a claim names the slot's end).
        Attempt(slots[0].start + SECOND, slots[0].end, "failed"),
        Attempt(slots[0].start + 20 * SECOND, slots[0].end, "ok"),
        # 1: three attempts, failed, abandoned, then failed: failed.
        Attempt(slots[1].start + SECOND, slots[1].end, "failed"),
        Attempt(slots[1].start + 9 * SECOND, slots[1].end, None, running=False),
        Attempt(slots[1].start + 19 * SECOND, slots[1].end, "lease_lost"),
        # 5: its only attempt has no end and holds nothing: abandoned, not failed.
        Attempt(slots[5].start + SECOND, slots[5].end, None, running=False),
        # 2: a lease run without a claim, started a little early (a host clock
        # ahead): it counts for the slot, and it is still going.
        Attempt(slots[2].start - 0.5 * SECOND, None, None, running=True),
        # 7, the current slot: one failed attempt, and the row waits for the next.
        Attempt(slots[7].start + SECOND, slots[7].end, "failed"),
    ]
    found = slot_states(
        slots,
        attempts,
        now=NOW,
        late=[slots[3].end],
        pauses=[Pause(slots[4].start - SECOND, slots[4].end)],
        retrying=slots[7].end,
    )
    assert [(state.state, state.attempts) for state in found] == [
        ("done", 2),
        ("failed", 3),
        ("running", 1),
        ("late", 0),
        ("paused", 0),
        ("abandoned", 1),
        ("missed", 0),
        ("retrying", 1),
    ]
    counts = count(found)
    assert counts["missed"] == 1 and counts["covered"] == 0 and sum(counts.values()) == 8
    # The row waiting for a retry names another slot (or none): the current slot failed.
    assert states_of(slots, attempts=attempts, retrying=slots[6].end)[7] == "failed"
    assert states_of(slots, attempts=attempts)[7] == "failed"


def test_a_rerun_slot_is_judged_by_the_attempts_after_the_rerun() -> None:
    slots = minutes(3)
    done_then_rerun = slots[0].start + 30 * SECOND
    attempts = [
        Attempt(slots[0].start + SECOND, slots[0].end, "ok"),
        Attempt(done_then_rerun + SECOND, slots[0].end, "failed"),
        Attempt(slots[1].start + SECOND, slots[1].end, "ok"),
    ]
    reruns = {slots[0].end: done_then_rerun, slots[2].end: slots[2].start + SECOND}
    found = slot_states(slots, attempts, now=NOW, reruns=reruns, retrying=slots[2].end)
    # The success before the rerun does not hide the failure after it; the current
    # slot, reopened and not taken yet, waits for its run.
    assert [(s.state, s.attempts) for s in found] == [("failed", 1), ("done", 1), ("retrying", 0)]
    assert states_of(slots, attempts=attempts)[0] == "done"  # the control: no rerun known


def test_a_slot_paused_past_its_deadline_reads_paused_though_marked_late() -> None:
    slots = minutes(2)
    pause = [Pause(slots[0].start - SECOND, slots[1].start - SECOND)]
    assert states_of(slots, attempts=[], late=[slots[0].end], pauses=pause) == ["paused", "missed"]
    assert states_of(slots, attempts=[], late=[slots[0].end]) == ["late", "missed"]


def test_a_pause_counts_only_if_in_force_as_the_slot_began() -> None:
    slots = minutes(4)
    began_within = [Pause(slots[1].start + SECOND, slots[3].start)]
    # Slot 1 began before the pause: nobody started it, it is missed; slot 2 began
    # within it; slot 3 began as it ended.
    assert states_of(slots, attempts=[], pauses=began_within) == [
        "missed",
        "missed",
        "paused",
        "missed",
    ]
    # A run in a paused slot (started before the pause, or by a 0.1.0 wrapper) wins.
    ran = [Attempt(slots[2].start + SECOND, slots[2].end, "ok")]
    assert states_of(slots, attempts=ran, pauses=began_within)[2] == "done"


def test_a_slot_a_lease_run_covered_is_covered_unless_paused_or_late() -> None:
    slots = minutes(5)
    spans = [Span(slots[0].start + SECOND, slots[3].start + SECOND)]
    ran = [Attempt(slots[0].start + SECOND, None, "ok")]
    assert states_of(slots, attempts=ran, spans=spans) == [
        "done",
        "covered",
        "covered",
        "covered",
        "missed",
    ]
    assert states_of(slots, attempts=ran, spans=spans, late=[slots[2].end])[2] == "late"


def test_pauses_end_as_planned_or_at_the_next_event_of_the_key() -> None:
    t = NOW - timedelta(hours=5)
    hour = timedelta(hours=1)
    spans = pause_spans(
        [
            # Paused for 30 min (ended by itself), then until resumed and resumed
            # an hour later; then paused for 2 h and replaced after one by a pause
            # until resumed, still in force.  Given in any order.
            Event(t + 3 * hour, t + 5 * hour, PAUSED),
            Event(t, t + hour / 2, PAUSED),
            Event(t + hour, UNTIL_RESUMED, PAUSED),
            Event(t + 2 * hour, t + 2 * hour, RESUMED),
            Event(t + 4 * hour, None, PAUSED),
        ]
    )
    assert spans == [
        Pause(t, t + hour / 2),
        Pause(t + hour, t + 2 * hour),
        Pause(t + 3 * hour, t + 4 * hour),
        Pause(t + 4 * hour, UNTIL_RESUMED),
    ]
    assert spans[3].covers(NOW) and not spans[1].covers(t + 2 * hour)
    assert pause_spans([Event(t, t + hour, RESUMED)]) == []
    # A rerun is an event of the key, but no end of its pause.
    assert pause_spans([Event(t, None, PAUSED), Event(t + hour, None, RERUN)]) == [
        Pause(t, UNTIL_RESUMED)
    ]
    assert reruns(
        [Event(t, t + hour, RERUN), Event(t + hour, t + hour, RERUN), Event(t, None, PAUSED)]
    ) == {t + hour: t + hour}


def test_the_slots_are_the_fires_cron_makes() -> None:
    """``missed`` and ``serve`` judge the slots of odd-dated Mondays only, as cron
    fires ``0 0 */2 * MON`` (both day fields must match, issue #62)."""
    since = datetime(2026, 12, 1, tzinfo=timezone.utc)
    slots = schedule_slots("0 0 */2 * MON", since, datetime(2027, 2, 1, tzinfo=timezone.utc))
    assert [f"{slot.start:%Y-%m-%d}" for slot in slots] == [
        "2026-12-07", "2026-12-21", "2027-01-11", "2027-01-25"
    ]  # fmt: skip
