"""A slot held back by ``LOCK_AFTER`` (``dislock.core.after``): the row's owner
naming the key, and the state ``slot_states`` decides for the slot."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from dislock.cli.runs.missed_slots import TO_LOOK_AT, Attempt, Slot, slot_states
from dislock.core.after import HELD_BACK, owner_of, waited_for
from dislock.core.operator_commands import Pause

T0 = datetime(2026, 1, 5, 3, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
SLOTS = [Slot(T0 + n * HOUR, T0 + (n + 1) * HOUR) for n in range(3)]
NOW = T0 + 4 * HOUR


def test_the_owner_names_the_key_waited_for() -> None:
    assert waited_for(owner_of("export, nightly")) == "export, nightly"
    assert waited_for("some-owner-token") is None
    assert waited_for(None) is None


def test_a_held_back_slot_is_neither_missed_nor_late_and_is_to_look_at() -> None:
    found = slot_states(
        SLOTS,
        [],
        now=NOW,
        late={SLOTS[0].end, SLOTS[1].end},
        held_back={SLOTS[0].end: "export"},
    )
    assert [state.state for state in found] == [HELD_BACK, "late", "missed"]
    assert found[0].waiting_for == "export"
    assert found[0].described() == "held back (waiting for 'export')"
    assert found[0].as_json()["waiting_for"] == "export"
    assert "waiting_for" not in found[2].as_json()
    assert HELD_BACK in TO_LOOK_AT


def test_a_slot_that_ran_after_being_held_back_is_judged_by_its_run() -> None:
    ran = Attempt(SLOTS[1].start + timedelta(minutes=5), SLOTS[1].end, "ok")
    failed = Attempt(SLOTS[2].start + timedelta(minutes=5), SLOTS[2].end, "failed")
    held = {slot.end: "export" for slot in SLOTS}
    found = slot_states(SLOTS, [ran, failed], now=NOW, held_back=held)
    assert [state.state for state in found] == [HELD_BACK, "done", "failed"]


def test_a_pause_wins_over_a_held_back_slot_and_an_unknown_key_is_not_named() -> None:
    pause = Pause(SLOTS[0].start, SLOTS[1].start)
    found = slot_states(
        SLOTS, [], now=NOW, pauses=[pause], held_back={SLOTS[0].end: "a", SLOTS[1].end: None}
    )
    assert [state.state for state in found] == ["paused", HELD_BACK, "missed"]
    assert found[1].described() == "held back"
