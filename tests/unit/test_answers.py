"""The lock statements' answers, read from rows as the server sends them, without a
database: each exchange's reader knows its statement's columns."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from dislock.core.answers import Acquired, SlotAnswer
from dislock.core.cron import UTC, SlotCandidates
from dislock.core.errors import ConfigurationError
from dislock.core.lock_statements import statements
from dislock.core.rows import lease_key, pause_key, schedule_key
from dislock.core.unknown_outcome import Mine

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=timezone.utc)
TABLE = statements(("key_value",), True)


def test_a_lease_taken_reads_its_token_and_timeline() -> None:
    exchange = TABLE.acquire_for(lease_key("job"), "me", 30.0)
    assert exchange.params["pause"] == pause_key("job") and exchange.params["ttl"] == 30.0
    answer = exchange.read([(True, 7, None, None, 3, None, None)])
    assert answer == Acquired(True, 7, None, None, None, None, 3)


def test_a_lease_over_the_tables_maximum_is_a_configuration_error() -> None:
    exchange = TABLE.acquire_for(lease_key("job"), "me", 7200.0)
    with pytest.raises(ConfigurationError, match="7200 s is longer than this table's maximum"):
        exchange.read([(False, None, None, None, 1, None, 3600.0)])


def test_a_pause_and_a_lock_delay_read_as_refusals() -> None:
    until = NOW + timedelta(hours=1)
    slot = TABLE.acquire_until(schedule_key("job"), "me", until)
    paused = slot.read([(False, None, "deploy", until, 1, None, None)])
    assert not paused.acquired and paused.paused_for == "deploy" and paused.paused_until == until
    delayed = slot.read([(False, None, None, None, 2, until, None)])
    assert not delayed.acquired and delayed.delayed_until == until and delayed.timeline == 2


def test_a_slot_picked_by_the_database_clock_reads_its_end() -> None:
    candidates = SlotCandidates.around("*/5 * * * *", NOW, UTC)
    exchange = TABLE.acquire_by_clock(schedule_key("job"), "me", candidates)
    assert exchange.params["covered_from"] == candidates.covered_from
    # The function takes the candidates as arrays, the plain statement one by one.
    assert exchange.params["ends"] == candidates.ends
    assert exchange.params["latest"] == candidates.latest_starts
    assert exchange.fallback is not None
    plain = exchange.fallback.params
    assert [plain[f"end_{i}"] for i in range(SlotCandidates.COUNT)] == list(candidates.ends)
    end = candidates.ends[0]
    answer = exchange.read([(True, None, None, None, 1, None, end)])
    assert answer.acquired and answer.slot_end == end
    assert exchange.read([(False, None, None, None, 1, None, None)]).slot_end is None


def test_a_slot_of_a_lease_reads_its_key_and_how_many_were_free() -> None:
    keys = [lease_key("job"), "cronjob-lock:lease#2:job"]
    exchange = TABLE.acquire_slot(keys, "me", 30.0)
    assert exchange.params["pause"] == pause_key("job")
    assert exchange.read([(keys[1], 4, 1, None, None, None, None)]) == SlotAnswer(
        keys[1], 4, 1, None, None, None
    )
    assert exchange.read([(None, None, 0, None, None, None, None)]).key is None
    with pytest.raises(ConfigurationError):
        exchange.read([(None, None, 0, None, None, None, 10.0)])


def test_an_acquiring_statement_answers_exactly_one_row() -> None:
    exchange = TABLE.acquire_for(lease_key("job"), "me", 30.0)
    with pytest.raises(ValueError, match="one row, not 0"):
        exchange.read([])


def test_release_renewal_clock_and_mine_read_their_rows() -> None:
    assert TABLE.release(lease_key("job"), "me", "job").read([("",)]) is True
    assert TABLE.hand_back([lease_key("job")], "me", "job").read([]) is False
    assert TABLE.now().read([(NOW,)]) == NOW
    mine = TABLE.mine([lease_key("job")], "me").read([(lease_key("job"), 5, NOW, 1)])
    assert mine == [Mine(lease_key("job"), 5, NOW, 1)]
    assert Acquired.from_mine(mine[0]) == Acquired(True, 5, None, None, NOW, None, 1)
    assert SlotAnswer.from_mine(mine[0]).key == lease_key("job")


def _looked(*rows: tuple[str, str, datetime], timeline: int = 1) -> list[tuple[object, ...]]:
    """``look``'s answer: the server's clocks and timeline, then each row found."""
    return [(NOW, NOW, timeline, key, value, expire_at) for key, value, expire_at in rows]


HELD = (lease_key("job"), "another", NOW + timedelta(minutes=1))


def test_a_look_refuses_only_for_a_live_row_with_nothing_else_to_say() -> None:
    look = TABLE.look(lease_key("job"), ttl=30.0)
    assert look.params == {"key": lease_key("job"), "pause": pause_key("job")}
    assert look.read(_looked(HELD)) == Acquired(False, None, None, None, None)
    calm = ("dislock:failover:timeline", "1", NOW - timedelta(hours=1))
    assert look.read(_looked(HELD, calm, ("dislock:config:max-ttl", "60", NOW))) is not None
    # Only the acquiring statement can tell: the row is free (missing or expired),
    # the key is paused, a lock delay runs or would start, the TTL is over the
    # maximum, or a metadata row cannot be read.
    assert look.read([]) is None
    assert look.read(_looked((lease_key("job"), "another", NOW))) is None
    assert look.read(_looked(HELD, (pause_key("job"), "deploy", NOW + timedelta(hours=1)))) is None
    assert look.read(_looked(HELD, calm, timeline=2)) is None
    delaying = ("dislock:failover:timeline", "1", NOW + timedelta(seconds=5))
    assert look.read(_looked(HELD, delaying)) is None
    assert look.read(_looked(HELD, ("dislock:config:max-ttl", "20", NOW))) is None
    assert look.read(_looked(HELD, ("dislock:config:max-ttl", "lots", NOW))) is None
    assert TABLE.look(lease_key("job"), ttl=7200.0).read(_looked(HELD)) is None
    # A pause that ended, or another key's row, says nothing.
    ended = (pause_key("job"), "deploy", NOW - timedelta(seconds=1))
    assert look.read(_looked(HELD, ended, (lease_key("other"), "x", NOW))) is not None


def test_a_look_by_clock_names_the_slot_the_database_clock_is_in() -> None:
    candidates = SlotCandidates.around("*/5 * * * *", NOW, UTC)
    look = TABLE.look(schedule_key("job"), pick=candidates.pick)
    held = (schedule_key("job"), "another", NOW + timedelta(minutes=5))
    later = [(NOW + timedelta(seconds=30), *row[1:]) for row in _looked(held)]
    refusal = look.read(later)
    assert refusal is not None and not refusal.acquired
    assert refusal.slot_end == NOW + timedelta(minutes=5)
    # A database clock outside the candidates: the statement reads it and retries.
    longer = (schedule_key("job"), "another", NOW + timedelta(days=2))
    far = [(NOW + timedelta(days=1), *row[1:]) for row in _looked(longer)]
    assert look.read(far) is None
