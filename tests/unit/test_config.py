"""Configuration rules of dislock-core, without a database."""

from __future__ import annotations

import math
import os
import re
import socket
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from dislock import ConfigurationError, LeaseLossPolicy, LockContext
from dislock.core.config import normalize_strategies, parse_table

URL = "postgresql://app:s3cr3t-pw@db.example:5432/app"


def context(**overrides: Any) -> LockContext:
    fields: dict[str, Any] = {
        "url": URL,
        "table_parts": ["key_value"],
        "lock_key": "job",
        "owner": "host:1",
    }
    fields.update(overrides)
    return LockContext(**fields)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("schedule", ("schedule",)),
        ("lease", ("lease",)),
        ("lease,schedule", ("schedule", "lease")),
        (" Schedule , LEASE ", ("schedule", "lease")),
        (("lease", "schedule", "lease"), ("schedule", "lease")),
        (["lease"], ("lease",)),
    ],
)
def test_normalize_strategies_puts_schedule_before_lease(given: Any, expected: Any) -> None:
    assert normalize_strategies(given) == expected


@pytest.mark.parametrize("given", ["", ",", "leases", "schedule,mutex", [], [3]])
def test_normalize_strategies_rejects_unknown_and_empty(given: Any) -> None:
    with pytest.raises(ConfigurationError):
        normalize_strategies(given)


@pytest.mark.parametrize(
    ("ttl", "interval"), [(1.0, 1.0), (2.0, 1.0), (10.0, 3.0), (60.0, 10.0), (600.0, 10.0)]
)
def test_derived_interval_is_30_percent_clamped_to_1_and_10_seconds(
    ttl: float, interval: float
) -> None:
    assert context(run_ttl_seconds=ttl).lease_interval_seconds == pytest.approx(interval)


@pytest.mark.parametrize(
    ("value", "parts"),
    [("key_value", ("key_value",)), ("ops.locks", ("ops", "locks")), (" Locks ", ("Locks",))],
)
def test_parse_table(value: str, parts: tuple[str, ...]) -> None:
    assert parse_table(value) == parts


@pytest.mark.parametrize("value", ["", "a.b.c", "a.", ".b", "x" * 64])
def test_parse_table_rejects(value: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_table(value)


def test_context_is_frozen_and_stores_table_parts_as_tuple() -> None:
    ctx = context(table_parts=["public", "key_value"])
    assert ctx.table_parts == ("public", "key_value")
    with pytest.raises(AttributeError):
        ctx.lock_key = "other"  # type: ignore[misc]


def test_context_repr_and_str_never_show_the_password() -> None:
    ctx = context()
    for text in (repr(ctx), str(ctx)):
        assert "s3cr3t-pw" not in text
        assert "db.example" in text
        assert "password=***" in text


def test_context_repr_shows_every_field_but_the_url_redacted() -> None:
    """Generated from the fields: one added later is shown without anyone listing it
    (the hand-written repr had missed four)."""
    import dataclasses

    ctx = context(wait_listen=False, connect_patience_seconds=7.0)
    text = repr(ctx)
    shown = [f.name for f in dataclasses.fields(ctx) if f.repr]
    assert "url" not in shown and "cron_zone" not in shown
    for name in shown:
        assert f"{name}={getattr(ctx, name)!r}" in text, name
    assert "wait_listen=False" in text and "connect_patience_seconds=7.0" in text
    assert text.startswith("LockContext(url='") and "password=***" in text


def test_context_with_unparseable_url_does_not_echo_it() -> None:
    with pytest.raises(ConfigurationError) as raised:
        context(url="postgresql//app:s3cr3t-pw@db")
    assert "s3cr3t-pw" not in str(raised.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lock_key": ""}, "lock_key"),
        ({"owner": "  "}, "owner"),
        ({"table_parts": []}, "table_parts"),
        ({"table_parts": "key_value"}, "table_parts"),
        ({"table_parts": ["a", "b", "c"]}, "table_parts"),
        ({"table_parts": ["bad\x00name"]}, "NUL"),
        ({"run_ttl_seconds": 0}, "run_ttl_seconds"),
        ({"run_ttl_seconds": -5}, "run_ttl_seconds"),
        ({"run_ttl_seconds": math.nan}, "run_ttl_seconds"),
        ({"run_ttl_seconds": "soon"}, "run_ttl_seconds"),
        ({"run_ttl_seconds": True}, "run_ttl_seconds"),
        ({"lease_interval_seconds": 0}, "lease_interval_seconds"),
        ({"run_ttl_seconds": 5, "lease_interval_seconds": 6}, "must not exceed"),
        ({"jitter_max_seconds": -1}, "jitter_max_seconds"),
        ({"jitter_max_seconds": math.inf}, "jitter_max_seconds"),
        ({"lease_loss_policy": "ignore"}, "lease_loss_policy"),
        ({"schedule": "every day"}, "cron"),
        ({"next_run_time": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"next_run_time": "2030-01-01"}, "next_run_time"),
        ({"connect_timeout_seconds": 0}, "connect_timeout_seconds"),
        (
            {"run_ttl_seconds": 1e12},
            "run_ttl_seconds must be at most 604800 s, got 1000000000000.0",
        ),
        ({"lease_interval_seconds": 0.0001}, "lease_interval_seconds must be at least 0.001 s"),
        (
            {"jitter_max_seconds": 1e9},
            "jitter_max_seconds must be at most 3600 s, got 1000000000.0",
        ),
        (
            {"schedule": "* * * * *", "jitter_max_seconds": 45},
            r"jitter_max_seconds \(45 s\) must be at most half .* schedule \(60 s\)",
        ),
        ({"connect_timeout_seconds": 1e6}, "connect_timeout_seconds must be at most 3600 s"),
        ({"lock_key": "k" * 2049}, "lock_key is 2049 bytes long; at most 2048 bytes"),
        ({"lock_key": "a\nb"}, "lock_key must not contain control"),
        ({"lock_key": "bad\udcffbytes"}, "lock_key must not contain control"),
        ({"owner": "host\r1"}, "owner must not contain control"),
        ({"schedule": "0 0 30 2 *"}, "schedule never fires: '0 0 30 2 \\*'"),
        ({"schedule": "0 3 * * *", "cron_tz": "Mars/Base"}, "cron_tz='Mars/Base' is not a known"),
        ({"cron_tz": 5}, "cron_tz must be an IANA time zone name"),
    ],
)
def test_context_rejects_bad_values_with_a_message_naming_them(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        context(**overrides)


def test_configuration_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="lock_key"):
        context(lock_key="")


def test_context_normalises_numbers_and_policy() -> None:
    ctx = context(
        run_ttl_seconds=60,
        lease_interval_seconds="10",
        jitter_max_seconds=0,
        lease_loss_policy="CONTINUE",
        next_run_time=datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=2))),
    )
    assert ctx.run_ttl_seconds == 60.0 and isinstance(ctx.run_ttl_seconds, float)
    assert ctx.lease_interval_seconds == 10.0
    assert ctx.lease_loss_policy is LeaseLossPolicy.CONTINUE


def test_wrapper_settings_repr_never_shows_the_password() -> None:
    from dislock.cli.wrapper.settings import read_wrapper_settings

    url = "postgresql://app:s3cr3t-pw@db.example/app"
    settings = read_wrapper_settings(
        "DATABASE_URL", ["true"], {"DATABASE_URL": url, "LOCK_KEY": "k", "CRON_SCHEDULE": "@daily"}
    )
    for text in (repr(settings), str(settings)):
        assert "s3cr3t-pw" not in text and "password=***" in text


def test_lock_context_defaults_url_table_owner_and_heartbeat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://app@db.internal/app")
    first = LockContext(lock_key="job", run_ttl_seconds=120)
    second = LockContext(lock_key="job")
    assert first.url == "postgresql://app@db.internal/app"
    assert first.table_parts == ("key_value",)
    assert re.fullmatch(
        rf"{re.escape(socket.gethostname())}:{os.getpid()}:[0-9a-f]{{8}}", first.owner
    )
    assert first.owner != second.owner
    assert first.lease_interval_seconds == 10.0  # 30 % of the TTL, at most 10 s
    assert LockContext(lock_key="job", run_ttl_seconds=5).lease_interval_seconds == 1.5


def test_lock_context_without_url_needs_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match=r"no url given and \$DATABASE_URL is not set"):
        LockContext(lock_key="job")
    monkeypatch.setenv("DATABASE_URL", "postgresql://app@db.internal/app")
    with pytest.raises(ConfigurationError, match="database URL is empty"):
        LockContext(lock_key="job", url="")  # an explicit empty URL is not the variable's


def test_a_ttl_below_the_minimum_heartbeat_needs_an_interval() -> None:
    with pytest.raises(ConfigurationError, match="give lease_interval_seconds too"):
        LockContext(url="postgresql://localhost/app", lock_key="job", run_ttl_seconds=0.5)
