"""Covered slots, the status page's wording and the renewer's failure counts, without
a database."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from dislock.cli.runs.history_report import describe_missed
from dislock.cli.runs.missed_slots import Slot, Span, schedule_slots, split_covered
from dislock.cli.serve.fleet_status import FleetSnapshot, HeldLock, KeyStatus, LastRun
from dislock.cli.serve.metrics import metric_families
from dislock.cli.serve.status_page import render_page
from dislock.core.context import LeaseLossPolicy
from dislock.core.lease_clock import LeaseClock, LeaseSettings
from dislock.core.renewal import (
    Batch,
    Renewal,
    count_failure,
    failure_summary,
    recovery_summary,
)

NOW = datetime(2026, 11, 30, 12, 0, 30, tzinfo=timezone.utc)


def minutes(count: int) -> list[Slot]:
    """The minute slots of the last ``count`` minutes, oldest first."""
    since = NOW.replace(second=0) - timedelta(minutes=count - 1)
    return list(schedule_slots("* * * * *", since, NOW, timedelta(0)))


def test_a_slot_is_covered_while_a_run_begun_before_it_is_going() -> None:
    slots = minutes(6)  # 11:55 … 12:00
    begun = slots[0].start + timedelta(seconds=5)
    # Ended 30 s into 11:57: covers 11:56 and 11:57, not 11:58 and later.
    ended = slots[2].start + timedelta(seconds=30)
    missed, covered = split_covered(slots[1:], [Span(begun, ended)])
    assert covered == slots[1:3] and missed == slots[3:]
    # Still going: every later slot.
    missed, covered = split_covered(slots[1:], [Span(begun, None)])
    assert covered == slots[1:] and missed == []
    # A run that began in the slot itself does not cover it (its start would count).
    inside = Span(slots[3].start + timedelta(seconds=1), None)
    assert split_covered(slots[3:4], [inside]) == (slots[3:4], [])
    # Ending exactly as a slot begins is not going during it.
    assert split_covered(slots[2:3], [Span(begun, slots[2].start)]) == (slots[2:3], [])
    assert split_covered(slots, []) == (slots, [])


def test_overlapping_and_nested_spans_merge() -> None:
    slots = minutes(10)
    spans = [
        Span(slots[0].start + timedelta(seconds=1), slots[4].start + timedelta(seconds=1)),
        Span(slots[1].start + timedelta(seconds=1), slots[2].start + timedelta(seconds=1)),
        Span(slots[3].start + timedelta(seconds=1), slots[6].start + timedelta(seconds=1)),
        Span(slots[8].start + timedelta(seconds=1), slots[8].start + timedelta(seconds=2)),
    ]
    missed, covered = split_covered(slots, list(reversed(spans)))
    assert covered == slots[1:7] and missed == [slots[0], *slots[7:]]


def test_the_summary_says_covered_apart_from_missed() -> None:
    since = NOW - timedelta(minutes=10)
    line = describe_missed("job", "* * * * *", "UTC", since, {"done": 3, "covered": 7})
    assert line.startswith("0 of 10 slot(s) of '* * * * *' (UTC)")
    assert line.endswith(
        "failed for 'job'; 3 done, 7 covered;"
        " covered: no start, but a run of it was still going and held its lease"
    )
    line = describe_missed("job", "* * * * *", "UTC", since, {"missed": 2, "done": 8})
    assert line.endswith("were missed, late or failed for 'job' (2 missed); 8 done")


def test_covered_slots_are_their_own_metric() -> None:
    keys = (KeyStatus("long", missed_slots=0, covered_slots=5), KeyStatus("bare"))
    families = {f.name: f for f in metric_families(FleetSnapshot(NOW, True, keys))}
    assert families["dislock_missed_slots"].samples == ((("long",), 0.0),)
    assert families["dislock_covered_slots"].samples == ((("long",), 5.0),)


def test_the_page_says_what_it_counts_and_why_a_cell_is_empty() -> None:
    run = LastRun("w:1:ab", "w", NOW - timedelta(minutes=3), "running", None, 180.0)
    keys = (
        KeyStatus("a", last_run=run, missed_slots=2, next_slot=NOW + timedelta(seconds=30)),
        KeyStatus("b", last_run=run, missed_slots=3, covered_slots=4),
        KeyStatus(
            "paused",
            last_run=run,
            paused_until=NOW + timedelta(hours=1),
            next_slot=NOW + timedelta(seconds=44),
            schedule="* * * * *",
            missed_slots=0,
        ),
        KeyStatus("no-history", locks=(HeldLock("lease", "w:2:cd", "held", 20.0),)),
    )
    page = render_page(FleetSnapshot(NOW, True, keys))
    # Two keys missed five slots between them: the header counts keys, and says so.
    assert "2 with missed or failed slots in the last 24 h" in page
    paused = page[page.index('data-key="paused"') :].split("</tr>", 1)[0]
    assert "in 44s" not in paused and '<span class="badge paused">paused</span>' in paused
    bare = page[page.index('data-key="no-history"') :].split("</tr>", 1)[0]
    assert "no run recorded" in bare and "LOCK_HISTORY=1" in bare
    covered = page[page.index('data-key="b"') :].split("</tr>", 1)[0]
    assert 'data-covered="4"' in covered and "4 covered by a run still going" in covered


def renewal(key: str) -> Renewal:
    clock = LeaseClock(LeaseSettings(3.0, 0.3, LeaseLossPolicy.TERMINATE), acquired_at=0.0)
    return Renewal(key=key, owner="o", table_parts=("t",), clock=clock)


def test_failures_are_logged_once_then_counted() -> None:
    one, two = renewal("a"), renewal("b")
    batch = Batch(("t",), [one])
    assert count_failure(batch, 1.0) is True
    assert count_failure(batch, 1.3) is False and count_failure(batch, 1.6) is False
    assert recovery_summary(batch, 2.0) == (
        "renewal of lease a succeeded again after 3 failed attempt(s) over 1.0 s"
    )
    assert recovery_summary(batch, 2.3) is None  # the count starts again
    # A lease joining a failing batch starts its own run of failures.
    assert count_failure(batch, 3.0) is True
    both = Batch(("t",), [one, two])
    assert count_failure(both, 3.3) is True and count_failure(both, 3.6) is False
    assert failure_summary(one, 4.0) == "renewal of lease a failed 3 times over 1.0 s"
    assert failure_summary(two, 4.0) == "renewal of lease b failed 2 times over 0.7 s"
    # A statement that was out when the lease was lost fails after the loss: the
    # loss's summary said it all, no new run of failures begins.
    one.clock.check_deadline(one.clock.deadline + 1.0)
    assert one.clock.lost and count_failure(Batch(("t",), [one]), 5.0) is False
    single = renewal("c")
    count_failure(Batch(("t",), [single]), 5.0)
    assert failure_summary(single, 6.0) is None  # the first failure's line said it
