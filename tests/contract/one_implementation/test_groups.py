"""``LockContext(group="NAME:N")`` in Python: at most N runs of the group's keys at
once, whatever their strategy; a run the group refuses raises what a conflict
raises and leaves its schedule slot open."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest

import dislock
import dislock.aio
from dislock import LockContext, LockNotAcquiredError
from dislock.core.errors import ConfigurationError
from dislock.core.rows import schedule_key
from tests.support.rows import Rows

MakeContext = Callable[..., LockContext]


def keyed(make_context: MakeContext, group: str, **fields: object) -> LockContext:
    """A context of a key of its own in ``group``."""
    return make_context(lock_key=f"job-{uuid.uuid4().hex[:8]}", group=group, **fields)


def test_sync_a_full_group_refuses_and_leaves_the_slot_open(
    make_context: MakeContext, rows: Rows
) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}:1"
    holder = keyed(make_context, group, run_ttl_seconds=30.0)
    slot_end = datetime.now(timezone.utc) + timedelta(hours=1)
    refused = keyed(make_context, group, next_run_time=slot_end)
    with dislock.acquire_locks(holder, "lease"):
        full = pytest.raises(LockNotAcquiredError, match=f"group {group.split(':')[0]!r}")
        with full, dislock.acquire_locks(refused, "schedule"):
            pytest.fail("ran beside the group's holder")
        row = rows.get(schedule_key(refused.lock_key))
        assert row is not None and row.expired, row  # handed back: the slot is open
    with dislock.acquire_locks(refused, "schedule") as session:  # a later tick starts it
        assert session.schedule is not None


@pytest.mark.asyncio
async def test_aio_a_group_of_two_admits_two(make_context: MakeContext) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}:2"
    first, second, third = (keyed(make_context, group, run_ttl_seconds=30.0) for _ in range(3))
    async with dislock.aio.acquire_locks(first, "lease"):
        async with dislock.aio.acquire_locks(second, "lease"):
            with pytest.raises(LockNotAcquiredError, match="2 slots"):
                async with dislock.aio.acquire_locks(third, "lease"):
                    pytest.fail("a third ran in a group of two")
        async with dislock.aio.acquire_locks(third, "lease"):  # a slot was released
            pass


@pytest.mark.parametrize(
    "group", ["heavy", "heavy:0", "heavy:1001", ":2", "heavy:x", "he\x07avy:2", "h" * 201 + ":2"]
)
def test_a_bad_group_is_refused_at_construction(make_context: MakeContext, group: str) -> None:
    with pytest.raises(ConfigurationError, match="group"):
        make_context(group=group)
