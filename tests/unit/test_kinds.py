"""The table of lock kinds: the one place that names kinds, their rows and their classes."""

from __future__ import annotations

import pytest

import dislock
import dislock.aio
from dislock.cli import admin
from dislock.core import kinds, rows


def test_row_keys_stay_those_dislock_0_1_0_shares() -> None:
    assert rows.schedule_key("nightly") == "cronjob-lock:schedule:nightly"
    assert rows.lease_key("nightly") == "cronjob-lock:lease:nightly"
    lease = kinds.kind("lease")
    assert lease.row_key("nightly", 1) == "cronjob-lock:lease:nightly"
    assert lease.row_key("nightly", 3) == "cronjob-lock:lease#3:nightly"


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("cronjob-lock:schedule:a:b", ("schedule", "a:b", 1)),
        ("cronjob-lock:lease:job#2", ("lease", "job#2", 1)),
        ("cronjob-lock:lease#2:job", ("lease", "job", 2)),
        ("cronjob-lock:lease#12:job#2", ("lease", "job#2", 12)),
        ("cronjob-lock:lease#1:job", (None, "cronjob-lock:lease#1:job", 1)),
        ("cronjob-lock:lease#x:job", (None, "cronjob-lock:lease#x:job", 1)),
        ("cronjob-lock:schedule#2:job", (None, "cronjob-lock:schedule#2:job", 1)),
        ("other:lease:job", (None, "other:lease:job", 1)),
    ],
)
def test_row_keys_parse_back_without_ambiguity(
    key: str, expected: tuple[str | None, str, int]
) -> None:
    found, lock_key, slot = kinds.parse_row_key(key)
    assert (None if found is None else found.name, lock_key, slot) == expected


def test_every_kind_has_its_class_everywhere() -> None:
    for kind in kinds.KINDS:
        assert isinstance(getattr(dislock, kind.lock_class), type)
        assert isinstance(getattr(dislock.aio, kind.lock_class), type)
    assert kinds.NAMES == admin.MODES == ("schedule", "lease")


def test_build_locks_follows_the_table() -> None:
    context = dislock.LockContext(
        url="postgresql://localhost/db",
        table_parts=["key_value"],
        lock_key="job",
        owner="me",
        schedule="* * * * *",
        run_ttl_seconds=5,
        lease_interval_seconds=1,
    )
    locks = dislock.build_locks(context, "lease,schedule")
    assert [type(lock).__name__ for lock in locks] == ["ScheduleLock", "LeaseLock"]
