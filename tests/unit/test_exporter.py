"""``serve``'s decisions without a database: listen addresses, run counting,
window starts, metric families, the page's order and escaping, host textfiles."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from dislock.cli.run_metrics import (
    Family,
    RunRecord,
    host_families,
    key_label,
    read_host_records,
    record_run,
)
from dislock.cli.serve.fleet_status import FleetSnapshot, KeyStatus, LastRun
from dislock.cli.serve.http_policy import parse_listen
from dislock.cli.serve.kept_runs import RunCounts, WindowStarts
from dislock.cli.serve.metrics import metric_families
from dislock.cli.serve.scrape import CensusRow, ScrapedRun
from dislock.cli.serve.status_page import page_order, render_page
from dislock.core.errors import ConfigurationError

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9655", ("127.0.0.1", 9655)),
        ("9655", ("127.0.0.1", 9655)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("[::1]:9100", ("::1", 9100)),
        ("localhost:80", ("localhost", 80)),
    ],
)
def test_listen_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize(
    "text", ["", ":9655", "host", "h:65536", "h:-1", "[::1]9655", "[x]:1", "::1:2"]
)
def test_bad_listen_addresses(text: str) -> None:
    with pytest.raises(ConfigurationError, match="--listen"):
        parse_listen(text)


def test_run_counts_count_each_run_once_and_follow_unfinished_ones() -> None:
    def run(run_id: int, lock_key: str, outcome: str | None) -> ScrapedRun:
        return ScrapedRun(run_id, lock_key, outcome, NOW, None, True, False, None, False)

    counts = RunCounts()
    counts.absorb_initial(
        10,
        [
            CensusRow("a", "ok", 7, None),
            CensusRow("a", None, 2, [3, 9]),
            CensusRow("b", "failed", 1, None),
        ],
    )
    assert counts.pending == {3, 9}
    # Above the floor: 11 finished, 12 running; pending 3 finished meanwhile.
    counts.absorb(
        11, [run(3, "a", "ok"), run(9, "a", None), run(11, "b", "ok"), run(12, "a", None)]
    )
    assert counts.by_key() == {"a": {"ok": 8}, "b": {"failed": 1, "ok": 1}}
    assert counts.pending == {9}
    # The same rows again (as an overlapping read would give them): nothing counted twice.
    counts.absorb(12, [run(9, "a", None), run(12, "a", "killed")])
    counts.absorb(12, [run(9, "a", None), run(12, "a", "killed")])
    assert counts.by_key()["a"] == {"ok": 8, "killed": 1}
    # A floor that moved back (clock step) does not rewind.
    counts.absorb(5, [])
    assert counts.floor == 12


def scheduled(
    run_id: int, lock_key: str, started: datetime, slot_end: datetime | None
) -> ScrapedRun:
    return ScrapedRun(run_id, lock_key, None, started, slot_end, True, False, None, False)


def test_window_starts_change_version_only_when_they_change() -> None:
    starts = WindowStarts()
    starts.add(scheduled(1, "a", NOW - timedelta(hours=2), None))
    version = starts.version("a")
    starts.add(scheduled(1, "a", NOW - timedelta(hours=2), None))
    assert starts.version("a") == version
    starts.add(scheduled(2, "a", NOW, NOW + timedelta(hours=1)))
    assert starts.version("a") > version and len(starts.of("a")) == 2
    version = starts.version("a")
    starts.trim(NOW - timedelta(hours=1))
    assert starts.of("a") == [(NOW, NOW + timedelta(hours=1))]
    assert starts.version("a") > version


def run(outcome: str, minutes_ago: float, duration: float | None = 5.0) -> LastRun:
    started = NOW - timedelta(minutes=minutes_ago)
    return LastRun("web-1:1:ab", "web-1", started, outcome, 3, duration)


def test_metric_families_of_a_snapshot() -> None:
    keys = (
        KeyStatus("fresh"),  # a lock row but no run yet
        KeyStatus("nightly", last_run=run("failed", 5), runs_total={"ok": 4, "failed": 1}),
    )
    families = {family.name: family for family in metric_families(FleetSnapshot(NOW, True, keys))}
    assert families["dislock_up"].samples == (((), 1.0),)
    runs = dict(families["dislock_runs"].samples)
    assert runs[("nightly", "ok")] == 4 and runs[("nightly", "lease_lost")] == 0
    assert not any(labels[0] == "fresh" for labels in runs)  # no runs: no zero counters
    starts = dict(families["dislock_last_start_timestamp_seconds"].samples)
    assert starts == {("nightly",): (NOW - timedelta(minutes=5)).timestamp()}
    assert families["dislock_last_success_timestamp_seconds"].samples == ()
    down = metric_families(FleetSnapshot(NOW, False))
    assert [f.samples for f in down if f.name == "dislock_up"] == [(((), 0.0),)]
    assert all(not f.samples for f in down if f.name != "dislock_up")


def test_the_newest_failures_come_first() -> None:
    keys = [
        KeyStatus("b-ok", last_run=run("ok", 1)),
        KeyStatus("old-failure", last_run=run("failed", 90)),
        KeyStatus("a-missed", last_run=run("ok", 3), missed_slots=2),
        KeyStatus("new-failure", last_run=run("lease_lost", 2)),
        KeyStatus("a-ok", last_run=run("ok", 1), missed_slots=0),
    ]
    assert [key.lock_key for key in page_order(keys)] == [
        "new-failure",
        "old-failure",
        "a-missed",
        "a-ok",
        "b-ok",
    ]


def test_the_page_escapes_what_the_database_says() -> None:
    hostile = KeyStatus(
        "<script>alert(1)</script>",
        paused_until=NOW + timedelta(hours=1),
        pause_reason='"><img src=x>',
        last_run=LastRun("<b>owner</b>", "<i>host</i>", NOW, "running", None, 1.0),
        schedule="0 * * * *",
    )
    page = render_page(FleetSnapshot(NOW, True, (hostile,)), title="<t>")
    for raw in ("<script>", "<img", "<b>owner", "<i>host", "<t>"):
        assert raw not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'http-equiv="refresh"' in page and "<script" not in page
    assert 'data-state="paused"' in page


def test_host_records_round_trip_through_their_samples() -> None:
    first = record_run({}, "nightly", 100.0, 160.0, "ok")
    second = record_run(first, "nightly", 200.0, 230.0, "failed")
    assert second["nightly"] == RunRecord(200.0, 30.0, 160.0, {"ok": 1, "failed": 1})
    samples = [
        (
            family.name + ("_total" if family.kind == "counter" else ""),
            dict(zip(family.labels, labels, strict=True)),
            value,
        )
        for family in host_families(second)
        for labels, value in family.samples
    ]
    again = read_host_records(samples)
    assert again["nightly"].last_success == 160.0
    assert again["nightly"].runs == {
        "ok": 1,
        "failed": 1,
        "lease_lost": 0,
        "killed": 0,
        "timed_out": 0,
        "late": 0,
        "rerun": 0,
    }


def test_the_chunked_exposition_is_prometheus_clients_own() -> None:
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from dislock.cli.run_metrics import Exposition, Families

    def whole(families: list[Family]) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(Families(families.copy))
        return generate_latest(registry)

    keys = [
        KeyStatus(f"job-{n:03d}", last_run=run("ok", n), runs_total={"ok": n}, missed_slots=0)
        for n in range(250)
    ]
    exposition = Exposition()
    families = metric_families(FleetSnapshot(NOW, True, tuple(keys)))
    assert exposition(families) == whole(families)
    keys[137] = keys[137]._replace(runs_total={"ok": 1000, "failed": 1})
    changed = metric_families(FleetSnapshot(NOW, True, tuple(keys[:-5])))
    assert exposition(changed) == whole(changed)


def test_the_page_says_how_each_lock_was_let_go() -> None:
    from dislock.cli.serve.fleet_status import HeldLock
    from dislock.core.pause import UNTIL_RESUMED

    key = KeyStatus(
        "etl",
        locks=(
            HeldLock("schedule", "web-1:1:aa", "ended", -30.0),
            HeldLock("lease", "web-2:2:bb", "released", -5.0, forced=True),
        ),
        paused_until=UNTIL_RESUMED,
        pause_reason="migration",
    )
    page = render_page(FleetSnapshot(NOW, True, (key,)))
    assert "schedule slot of web-1:1:aa ended" in page
    assert "lease of web-2:2:bb released by dislockctl" in page
    assert "until resumed: migration" in page
    assert KeyStatus("etl", locks=key.locks).state == "released"


def test_lock_held_is_one_sample_per_key_and_mode() -> None:
    from dislock.cli.serve.fleet_status import HeldLock

    key = KeyStatus(
        "pool",
        locks=(
            HeldLock("lease", "a:1:x", "held", 10.0),
            HeldLock("lease", "b:2:y", "held", 12.0),
            HeldLock("lease", "c:3:z", "released", -1.0),
            HeldLock("schedule", "a:1:x", "ended", -5.0),
        ),
    )
    families = {f.name: f for f in metric_families(FleetSnapshot(NOW, True, (key,)))}
    assert families["dislock_lock_held"].samples == (
        (("pool", "lease"), 2.0),
        (("pool", "schedule"), 0.0),
    )


def test_label_values_are_keys_dislock_takes_or_clipped_apart() -> None:
    """Every key dislock takes is its own label value; one written by hand that no
    key could be is escaped and clipped, and two such keys stay two series (a
    duplicate would make Prometheus refuse the scrape)."""
    for key in ("nightly", "a b/c", "é" * 1024):
        assert key_label(key) == key
    long_a, long_b = "k" * 5000 + "a", "k" * 5000 + "b"
    assert key_label(long_a) != key_label(long_b)
    assert all(len(key_label(key)) < 80 for key in (long_a, long_b, "\x1b" * 100))
    assert key_label("a\x1bb") != key_label("a\\x1bb")
    assert "\x1b" not in key_label("a\x1bb") and key_label("a\x1bb").startswith("a\\x1bb (")
    runs = {"ok": 2, "\x1b]0;owned\x07": 1, "x" * 100: 1}
    snapshot = FleetSnapshot(NOW, up=True, keys=(KeyStatus("nightly", runs_total=runs),))
    (family,) = [f for f in metric_families(snapshot) if f.name == "dislock_runs"]
    assert dict((labels[1], value) for labels, value in family.samples) == {
        "ok": 2.0,
        "failed": 0.0,
        "lease_lost": 0.0,
        "killed": 0.0,
        "timed_out": 0.0,
        "late": 0.0,
        "rerun": 0.0,
        "other": 2.0,
    }
