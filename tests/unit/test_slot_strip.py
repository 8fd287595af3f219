"""The status page's slot strip and a key's page without a database: each cell's state is
``slot_states``' (a failed slot says how its last attempt ended), its duration against
the envelope, its title and glyph; the page of a key whose name is markup."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from html import escape

from dislock.cli.runs.envelope import envelope_of
from dislock.cli.runs.missed_slots import Slot, schedule_slots
from dislock.cli.runs.run_history import Run
from dislock.cli.serve.fleet_status import FleetSnapshot, KeyStatus
from dislock.cli.serve.kept_runs import WindowStarts
from dislock.cli.serve.key_page import render_key_page
from dislock.cli.serve.scrape import ScrapedRun
from dislock.cli.serve.slot_strip import STRIP_SLOTS, EarlierSlots, StripSource, strip_cells
from dislock.cli.serve.status_page import render_page
from dislock.cli.serve.strip_html import GLYPHS, strip_html
from dislock.core.cron import next_boundary

NOW = datetime(2026, 12, 7, 12, 0, 30, tzinfo=timezone.utc)
MINUTE = timedelta(minutes=1)
USUAL = envelope_of([2.0] * 10)
KEY = "job"


def attempt(
    run_id: int, minutes_back: int, outcome: str | None, seconds: float, into: int = 5
) -> ScrapedRun:
    """A run ``into`` s into the slot that began ``minutes_back`` minutes before this one."""
    start = NOW.replace(second=0) - minutes_back * MINUTE + timedelta(seconds=into)
    ended = None if outcome is None else start + timedelta(seconds=seconds)
    slot_end = NOW.replace(second=0) - (minutes_back - 1) * MINUTE
    return ScrapedRun(run_id, KEY, outcome, start, slot_end, True, False, ended, outcome is None)


def source(*runs: ScrapedRun, ran_before: bool = True) -> StripSource:
    since = NOW - timedelta(hours=1)
    starts = WindowStarts()
    starts.take(list(runs), since)
    slots = list(schedule_slots("* * * * *", since, NOW))[-STRIP_SLOTS:]
    first = min((run.started_at for run in runs), default=NOW)
    return StripSource(slots, starts, KEY, ran_before, first, USUAL)


def test_each_cell_is_its_slots_state_and_its_runs_duration() -> None:
    runs = (
        attempt(1, 6, "ok", 2.0),
        attempt(2, 5, "failed", 1.0),
        attempt(3, 4, "failed", 1.0),  # a retry in the same slot, then it timed out
        attempt(4, 4, "timed_out", 9.0, into=20),
        attempt(5, 1, None, 0.0),  # still going, 85 s so far: slow
    )
    cells = strip_cells(source(*runs), NOW)
    assert len(cells) == STRIP_SLOTS and cells[-1].slot.start == NOW.replace(second=0) - MINUTE
    last = [(cell.state, cell.seconds, cell.mark) for cell in cells[-6:]]
    assert last == [
        ("done", 2.0, None),
        ("failed", 1.0, None),
        ("timed_out", 9.0, "slow"),
        ("missed", None, None),
        ("missed", None, None),
        ("running", 85.0, "slow"),
    ]
    assert {cell.state for cell in cells[:-6]} == {"missed"}


def test_a_job_new_within_the_window_missed_nothing_before_its_first_run() -> None:
    cells = strip_cells(source(attempt(1, 3, "ok", 2.0), ran_before=False), NOW)
    assert [cell.state for cell in cells] == ["done", "missed", "missed"]


def test_cells_are_told_apart_by_glyph_and_named_by_slot_time_and_state() -> None:
    cells = strip_cells(source(attempt(1, 2, "timed_out", 9.0)), NOW)
    shown = strip_html(cells, USUAL, NOW)
    assert shown.count('<i role="img"') == STRIP_SLOTS
    assert 'class="s-timed_out slow" title="11:58 timed out, 9.0s (slow)"' in shown
    assert 'class="s-missed" title="11:59 missed"' in shown
    # Colour is not all: the states a person must tell apart have glyphs of their own.
    told = ("done", "running", "failed", "timed_out", "held_back", "paused", "missed")
    assert len({GLYPHS[state][0] for state in told}) == len(told)


def test_a_keys_page_escapes_its_name_and_lists_its_runs() -> None:
    hostile = '<img src=x onerror="alert(1)">'
    run = Run(7, KEY, "schedule", None, "<o>", "<h>", 1, NOW, NOW, "failed", 3, None, 1.0, "", "")
    snapshot = FleetSnapshot(NOW, up=True, keys=(KeyStatus(hostile),))
    page = render_key_page(snapshot, snapshot.keys[0], [run], [])
    assert "<img" not in page and escape(hostile) in page
    assert 'data-run="7" data-outcome="failed"' in page and "exit 3" in page
    assert "&lt;h&gt;" in page and "no audited action" in page
    # The main page links the key's page, its name URL-encoded whole.
    assert 'href="key/%3Cimg%20src%3Dx%20onerror%3D%22alert%281%29%22%3E"' in render_page(snapshot)


def test_a_strip_walks_back_past_the_window_within_bounds() -> None:
    """A daily job's 30 slots are a month's; a monthly job's stop at 400 days; a page's
    budget cut short shows fewer, and the walk is done again (not kept) next time."""
    since = NOW - timedelta(hours=24)

    def walked(cron: str, budget: int) -> list[Slot]:
        window = list(schedule_slots(cron, since, NOW))
        after = next_boundary(cron, NOW)
        found = source()._replace(slots=window, cron=cron, next_slot=after)
        return earlier.slots(found, NOW, [budget])

    earlier = EarlierSlots()
    daily = walked("0 3 * * *", 1000)
    assert [slot.start for slot in daily] == [
        NOW.replace(hour=3, minute=0, second=0) - timedelta(days=back) for back in range(29, -1, -1)
    ]
    assert len(walked("0 0 1 * *", 1000)) == 13  # a monthly job's slots of 400 days
    assert len(walked("0 3 * * 1", 5)) == 1 + 5  # a weekly one (today's in the window), cut short
    assert len(walked("0 3 * * 1", 1000)) == 30  # and not kept short
