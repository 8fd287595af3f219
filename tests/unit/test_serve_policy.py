"""``dislockctl serve``'s rules before and around the database: Host names, connections
per client, recorded
zones, and the bounded slot computation (``dislock.cli.serve.http_policy``,
``dislock.cli.serve.slot_windows``, ``dislock.core.cron_zone.recorded_zone``)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from dislock.cli.runs.missed_slots import schedule_slots
from dislock.cli.serve.fleet_reader import _Turns
from dislock.cli.serve.fleet_status import FAILED_OUTCOMES, FleetSnapshot, lock_delay_end
from dislock.cli.serve.http_policy import (
    Admission,
    HostPolicy,
    Limits,
    allowed_host,
    client_of,
    host_name,
    request_timeout,
)
from dislock.cli.serve.kept_runs import WindowStarts
from dislock.cli.serve.metrics import metric_families
from dislock.cli.serve.scrape import ScrapedRun
from dislock.cli.serve.slot_windows import ScheduleWindows
from dislock.cli.serve.status_page import render_page
from dislock.core.cron_zone import recorded_zone
from dislock.core.errors import ConfigurationError

NOW = datetime(2026, 12, 1, 12, 0, 30, tzinfo=timezone.utc)
SINCE = NOW - timedelta(hours=24)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("localhost", "localhost"),
        ("LocalHost:9655", "localhost"),
        ("127.0.0.1:9655", "127.0.0.1"),
        ("[::1]:9655", "::1"),
        ("[0:0::1]", "::1"),
        ("ops-1.example.internal.", "ops-1.example.internal"),
        ("::1", None),  # an IPv6 address needs its brackets in a Host header
        ("evil.example:port", None),
        ("[::1", None),
        ("a b", None),
        ("", None),
        ("x" * 300, None),
    ],
)
def test_host_header_values(header: str, expected: str | None) -> None:
    assert host_name(header) == expected


def test_the_allowed_hosts_are_loopback_listen_and_allow_host() -> None:
    policy = HostPolicy("10.0.0.5", ["ops-1.example.internal", "[fd00::1]"])
    for header in ("localhost:9655", "127.0.0.1", "[::1]:1", "10.0.0.5:9655"):
        assert policy.allows([header]), header
    assert policy.allows(["OPS-1.example.internal:9655"])
    assert policy.allows(["[fd00::1]:9655"])
    # DNS rebinding: a name the attacker points at 127.0.0.1.
    assert not policy.allows(["rebind.attacker.example:9655"])
    assert not policy.allows(["127.0.0.1.attacker.example"])
    assert not policy.allows(["localhost", "localhost"])  # two Host headers
    assert policy.allows([])  # HTTP/1.0 without Host: no browser sends that


@pytest.mark.parametrize("bad", ["", "host:9655", "a b", "*", "[::1]:80", "-x"])
def test_bad_allow_host_values(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="--allow-host"):
        allowed_host(bad)


@pytest.mark.parametrize("bad", ["0", "-1", "x", "nan", "inf", "3601"])
def test_bad_request_timeouts(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="--request-timeout"):
        request_timeout(bad)


@pytest.mark.parametrize(
    ("address", "client"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.0.0.2", "127.0.0.2"),
        ("::ffff:10.0.0.7", "10.0.0.7"),  # an IPv4 client of a dual-stack socket
        ("::1", "::1"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),  # the same host's /64
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("/run/x.sock", "/run/x.sock"),
    ],
)
def test_who_a_connection_counts_as(address: str, client: str) -> None:
    assert client_of(address) == client


def test_one_client_is_served_its_share_and_no_more() -> None:
    admission: Admission[int] = Admission(Limits(max_connections=5, max_per_client=2))
    assert [admission.admit("a", n)[0] for n in range(3)] == [None, None, "client"]
    assert [admission.admit("b", n)[0] for n in (3, 4)] == [None, None]
    assert admission.admit("c", 5) == (None, [])
    assert admission.admit("d", 6) == ("all", [])  # 5 served: whoever asks
    for conn in range(6):
        admission.started(conn)  # their requests were read: none is idle
    admission.done(0)
    assert admission.admit("a", 7) == (None, [])
    assert admission.admit("d", 8) == ("all", [])
    for conn in (1, 3, 4, 5, 7):
        admission.done(conn)
    assert (len(admission.clients), admission.by_client, admission.idle) == (0, {}, {})


def test_the_oldest_idle_connection_makes_room_for_a_new_one() -> None:
    """Idle connections from many addresses (each under its own limit) took every
    connection served: now at most ``max_idle`` of them are kept, the oldest closed."""
    admission: Admission[int] = Admission(Limits(max_connections=8, max_per_client=2, max_idle=4))
    assert [admission.admit(f"10.0.0.{n // 2}", n) for n in range(4)] == [(None, [])] * 4
    assert admission.admit("10.0.0.2", 4) == (None, [0])  # the oldest idle one
    admission.started(1)  # 1 sent its request: no longer idle, never closed for it
    assert admission.admit("10.0.0.3", 5) == (None, [])
    assert admission.admit("10.0.0.3", 6) == (None, [2])
    assert (len(admission.clients), list(admission.idle)) == (5, [3, 4, 5, 6])
    assert admission.by_client == {"10.0.0.0": 1, "10.0.0.1": 1, "10.0.0.2": 1, "10.0.0.3": 2}
    admission.done(0)  # its thread ends after it was closed: nothing counted twice
    assert len(admission.clients) == 5
    assert admission.admit("10.0.0.3", 7) == ("client", [])  # its own limit first


def test_idle_connections_closed_count_until_their_threads_end() -> None:
    """Connections closed for being idle, no longer counted, let a flood of half-sent
    requests start a thread for each (security review #61): they count against
    ``max_connections`` until their threads end, and none of them is answered."""
    admission: Admission[int] = Admission(Limits(max_connections=4, max_per_client=4, max_idle=2))
    assert [admission.admit("a", n) for n in range(2)] == [(None, [])] * 2
    assert admission.admit("b", 2) == (None, [0])
    assert admission.admit("c", 3) == (None, [1])
    assert admission.closing == {0, 1}
    assert admission.admit("d", 4) == ("all", [2])  # 2 threads closing, 2 idle
    assert admission.started(0) is False  # its request read after it was closed: not answered
    assert admission.started(3) is True
    for conn in (0, 1):
        admission.done(conn)
    assert admission.admit("d", 4) == (None, [])  # 2 and 3 served, 4 idle
    for conn in (2, 3, 4):
        admission.done(conn)
    assert (admission.clients, admission.by_client, admission.idle, admission.closing) == (
        {},
        {},
        {},
        set(),
    )


def test_a_request_that_gives_up_leaves_the_connection_to_its_holder() -> None:
    """One that gave up waiting set the connection free while another read over it:
    two threads on one psycopg connection, one closing it under the other's read,
    crashed serve (security review #61)."""
    turns = _Turns()
    assert turns.take(scrape=False, timeout=0)
    assert not turns.take(scrape=True, timeout=0)  # gives up
    assert not turns.take(scrape=False, timeout=0)  # still the first one's
    turns.give_back()
    assert turns.take(scrape=True, timeout=0)


@pytest.mark.parametrize(
    "value",
    [
        "/etc/localtime",
        "/dev/stdin",
        "../../../../tmp/fifo",
        "Europe/../../../tmp/fifo",
        ":Europe/Berlin",
        "localtime",  # Debian links it to /etc/localtime, outside the database
        "JST-9",  # a POSIX rule, not a name of the database
        "Europe",  # a directory of the database
        "Europe/Berlin\x1b[31m",
        "Europe/" + "x" * 100,
    ],
)
def test_a_recorded_zone_is_only_an_iana_name(value: str) -> None:
    with pytest.raises(ConfigurationError, match="not an IANA time zone name") as raised:
        recorded_zone(value)
    assert "\x1b" not in str(raised.value) and len(str(raised.value)) < 200


def test_iana_names_are_read() -> None:
    for name in ("Europe/Berlin", "UTC", "Etc/GMT-5", "America/Argentina/Buenos_Aires"):
        assert recorded_zone(name) == ZoneInfo(name)


def test_slots_computed_in_turns_are_those_of_schedule_slots() -> None:
    """Whatever the budget cuts, the slots a key ends up with are the same."""
    tz = ZoneInfo("Europe/Berlin")
    expected = list(schedule_slots("*/5 * * * *", SINCE, NOW, tz=tz))
    windows = ScheduleWindows(budget=50)
    counted, scrapes = None, 0
    while counted is None and scrapes < 20:
        found = windows.scrape([("k", "*/5 * * * *", "Europe/Berlin")], SINCE, NOW)
        assert found.boundaries <= 50
        counted, scrapes = found.windows["k"].slots, scrapes + 1
    assert counted == expected and scrapes >= 6  # 288 slots, under 50 a scrape
    # And on from there as time passes: only the new slots are computed.
    later = NOW + timedelta(minutes=10)
    found = windows.scrape(
        [("k", "*/5 * * * *", "Europe/Berlin")], later - timedelta(hours=24), later
    )
    assert found.windows["k"].slots == list(
        schedule_slots("*/5 * * * *", later - timedelta(hours=24), later, tz=tz)
    )
    assert found.boundaries <= 4


def test_one_scrape_computes_at_most_its_budget_whatever_the_history_says() -> None:
    invented = [
        (f"invented-{n}", "* * * * * *", zone)
        for n, zone in enumerate(["Europe/Berlin", "Asia/Kolkata", "Pacific/Chatham", "UTC"])
    ]
    honest = ("zz-honest", "0 * * * *", None)  # last in the key order
    windows = ScheduleWindows(budget=1000, max_window_slots=300)
    honest_counted_at = None
    for scrape in range(1, 30):
        found = windows.scrape([*invented, honest], SINCE, NOW)
        assert found.boundaries <= 1000
        for key, _, _ in invented:
            assert found.windows[key].slots is None  # never counted
        if honest_counted_at is None and found.windows["zz-honest"].slots is not None:
            honest_counted_at = scrape
    # Taking turns, the invented keys do not hold back the honest one for long.
    assert honest_counted_at is not None and honest_counted_at <= 2
    assert found.boundaries <= len(invented) + 1  # the next slots, nothing else
    assert found.windows["zz-honest"].slots == list(schedule_slots("0 * * * *", SINCE, NOW))


def test_a_key_keeps_a_bounded_number_of_readings() -> None:
    windows = ScheduleWindows(max_readings=3)
    zones = ["Europe/Berlin", "Asia/Kolkata", "America/New_York", "Asia/Tokyo", "UTC"]
    notes = []
    for zone in zones:
        found = windows.scrape([("k", "0 * * * *", zone)], SINCE, NOW)
        notes += found.notes
    assert "k" not in found.windows  # a fourth and fifth reading are not computed at all
    assert found.boundaries == 0
    assert any("more than 3 schedules" in note for note in notes)
    assert len(notes) == 1  # told once
    # A reading it already has is still counted.
    assert windows.scrape([("k", "0 * * * *", "Asia/Kolkata")], SINCE, NOW).windows["k"].slots
    # Once the older ones were not seen for a window, a new one is taken.
    later = NOW + timedelta(hours=25)
    found = windows.scrape([("k", "0 * * * *", "Asia/Tokyo")], later - timedelta(hours=24), later)
    assert found.windows["k"].slots is not None


def test_unreadable_readings_are_told_once_and_not_counted() -> None:
    windows = ScheduleWindows()
    schedules = [
        ("fifo", "* * * * *", "/tmp/fifo"),
        ("posix", "* * * * *", "JST-9"),
        ("cron", "not a cron", "UTC"),
        ("long", "0 " + ",".join(["1"] * 100) + " * * *", "UTC"),
    ]
    first = windows.scrape(schedules, SINCE, NOW)
    assert all(first.windows[key] == (None, 0, None) for key, _, _ in schedules)
    assert len(first.notes) == 4
    assert any("'/tmp/fifo' is not an IANA time zone name" in note for note in first.notes)
    again = windows.scrape(schedules, SINCE, NOW)
    assert again.notes == [] and again.boundaries == 0


def test_window_starts_copies_do_not_follow_the_original() -> None:
    def scheduled(run_id: int, lock_key: str) -> ScrapedRun:
        return ScrapedRun(run_id, lock_key, None, NOW, None, True, False, None, False)

    starts = WindowStarts()
    starts.add(scheduled(1, "k"))
    copy = starts.copy()
    starts.add(scheduled(2, "k"))
    starts.add(scheduled(3, "other"))
    assert copy.of("k") == [(NOW, None)] and copy.of("other") == []
    assert copy.version("k") == 1 and starts.version("k") == 2


def test_the_lock_delay_end_is_exported_while_it_runs() -> None:
    def sample(snapshot: FleetSnapshot) -> tuple[tuple[tuple[str, ...], float], ...]:
        (family,) = (
            f
            for f in metric_families(snapshot)
            if f.name == "dislock_lock_delay_end_timestamp_seconds"
        )
        return family.samples

    end = NOW + timedelta(minutes=10)
    assert lock_delay_end(end, NOW) == end
    assert lock_delay_end(NOW - timedelta(seconds=1), NOW) is None
    assert lock_delay_end(None, NOW) is None
    assert sample(FleetSnapshot(NOW, True, lock_delay_end=end)) == (((), end.timestamp()),)
    assert sample(FleetSnapshot(NOW, True)) == (((), 0.0),)
    assert sample(FleetSnapshot(NOW, False)) == ()
    page = render_page(FleetSnapshot(NOW, True, lock_delay_end=end))
    assert 'id="lock-delay"' in page and "2026-12-01 12:10:30 UTC" in page
    assert 'id="lock-delay"' not in render_page(FleetSnapshot(NOW, True))


def test_keys_that_read_a_schedule_alike_share_its_slots() -> None:
    windows = ScheduleWindows()
    fleet = [(f"job-{n:04}", f"{n % 3} * * * *", None) for n in range(1000)]
    found = windows.scrape(fleet, SINCE, NOW)
    assert found.boundaries <= 3 * 26  # three expressions, whatever the number of keys
    assert all(window.slots is not None for window in found.windows.values())


def test_the_page_styles_every_failed_outcome_red_and_late_its_own_way() -> None:
    page = render_page(FleetSnapshot(NOW, True))
    rules = dict(re.findall(r"([^{}\n]+)\{([^}]*)\}", page))
    (red,) = [style for selector, style in rules.items() if ".failed" in selector.split(",")]
    for outcome in FAILED_OUTCOMES:
        (style,) = [
            style for selector, style in rules.items() if f".{outcome}" in selector.split(",")
        ]
        assert style == red, outcome
    late = [style for selector, style in rules.items() if ".late" in selector.split(",")]
    assert late == [late[0]] and list(rules.values()).count(late[0]) == 1  # a style of its own
