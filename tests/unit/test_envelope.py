"""A key's runtime envelope without a database: the rule's boundaries, which rows are
runs to judge, and what the exporter and the page make of a run past it."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from dislock.cli.runs.envelope import SHORT, SLOW, Envelope, envelope_of, marks
from dislock.cli.runs.run_history import Run
from dislock.cli.serve.fleet_status import FleetSnapshot, KeyStatus, LastRun
from dislock.cli.serve.metrics import metric_families
from dislock.cli.serve.status_page import render_page

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
USUAL = envelope_of([1.0] * 10)


def test_ten_successes_make_an_envelope_nine_do_not() -> None:
    assert envelope_of([1.0] * 9) is None
    assert envelope_of([1.0] * 10) == Envelope(1.0, 1.0, 10)


def test_only_the_newest_twenty_count() -> None:
    # Newest first: the 40 older, longer runs are past the window.
    assert envelope_of([2.0] * 20 + [50.0] * 40) == Envelope(2.0, 2.0, 20)


def test_slow_is_past_three_times_the_median_and_past_the_longest() -> None:
    assert USUAL is not None
    assert USUAL.judge(3.0) is None  # exactly 3 x the median
    assert USUAL.judge(3.01) == SLOW
    # 3 x the median is 3 s, but one of the runs took 5 s: an ordinary run for this job.
    varied = envelope_of([1.0] * 9 + [5.0])
    assert varied is not None and varied.median == 1.0
    assert varied.judge(4.0) is None and varied.judge(5.0) is None
    assert varied.judge(5.01) == SLOW


def test_short_is_under_a_third_of_the_median() -> None:
    envelope = envelope_of([3.0] * 10)
    assert envelope is not None
    assert envelope.judge(1.0) is None  # exactly a third
    assert envelope.judge(0.99) == SHORT
    assert envelope.judge(0.99, running=True) is None  # not over yet
    assert envelope.judge(None) is None  # abandoned: how long is not known


def run(run_id: int, outcome: str, duration: float | None) -> Run:
    return Run(
        run_id, "job", "lease", None, "o", "h", 1, NOW, None, outcome, 0, None, duration, None, None
    )


def test_every_run_is_judged_but_late_marks_and_operators_events() -> None:
    runs = [
        run(1, "failed", 0.1),
        run(2, "running", 9.0),
        run(3, "late", 0.0),
        run(4, "paused", 0.0),
        run(5, "ok", 0.1),
        run(6, "ok", 0.1),
    ]
    assert marks(runs, [USUAL] * 5 + [None]) == {
        1: SHORT,
        2: SLOW,
        3: None,
        4: None,
        5: SHORT,
        6: None,  # fewer than ten successes before it
    }


def snapshot(outcome: str, duration: float, envelope: Envelope | None) -> FleetSnapshot:
    last = LastRun("o", "h", NOW, outcome, None, duration, None, envelope)
    return FleetSnapshot(NOW, up=True, keys=(KeyStatus("job", last_run=last),))


def past_envelope(found: FleetSnapshot) -> tuple[tuple[tuple[str, ...], float], ...] | None:
    (family,) = [f for f in metric_families(found) if f.name == "dislock_running_past_envelope"]
    return family.samples


@pytest.mark.parametrize(
    ("outcome", "duration", "envelope", "samples"),
    [
        ("running", 3.5, USUAL, ((("job",), 1.0),)),
        ("running", 2.5, USUAL, ((("job",), 0.0),)),
        ("ok", 3.5, USUAL, ((("job",), 0.0),)),  # slow, but over: history tells
        ("running", 3.5, None, ()),  # too few runs to know
    ],
)
def test_the_exporter_flags_a_run_still_going_past_its_envelope(
    outcome: str, duration: float, envelope: Envelope | None, samples: tuple[object, ...]
) -> None:
    assert past_envelope(snapshot(outcome, duration, envelope)) == samples


def test_the_page_marks_the_latest_run() -> None:
    assert 'data-envelope="slow"' in render_page(snapshot("ok", 3.5, USUAL))
    assert "running past its envelope" in render_page(snapshot("running", 3.5, USUAL))
    assert 'data-envelope="short"' in render_page(snapshot("ok", 0.1, USUAL))
    assert 'data-envelope=""' in render_page(snapshot("ok", 1.0, USUAL))
