"""Contract: fencing tokens, on every implementation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock import LeaseLostError, LockContext
from dislock.core.rows import lease_key, schedule_key
from tests.support.drivers import Driver
from tests.support.rows import Rows

MakeContext = Callable[..., LockContext]
# Frequent renewals; a TTL that leaves a loaded machine over a second of stalled
# renewals before the lease is lost (the local deadline is 90 % of the TTL).
LEASE = {"run_ttl_seconds": 2.0, "lease_interval_seconds": 0.2}
YEARLY = "0 0 1 1 *"


def fence_of(db: psycopg.Connection[Any], table: tuple[str, str], key: str) -> int:
    row = db.execute(
        sql.SQL("SELECT fence FROM {} WHERE key = %s").format(sql.Identifier(*table)), (key,)
    ).fetchone()
    assert row is not None
    value: int = row[0]
    return value


def test_tokens_grow_across_release_expiry_and_forced_release(
    driver: Driver, make_context: MakeContext, rows: Rows, fenced: tuple[str, str]
) -> None:
    tokens = []
    context = make_context(fencing=True, **LEASE)
    key = lease_key(context.lock_key)

    held = driver.hold(context, ["lease"])  # first acquisition: a fresh row
    tokens.append(held.fencing_token())
    held.release()  # released normally

    held = driver.hold(make_context(fencing=True, **LEASE), ["lease"])
    tokens.append(held.fencing_token())
    rows.expire(key)  # forced release (as `dislockctl release` does) while held
    assert held.wait_lease_lost(10.0)
    with pytest.raises(LeaseLostError):  # the holder is told
        held.release()

    held = driver.hold(make_context(fencing=True, **LEASE), ["lease"])
    tokens.append(held.fencing_token())
    held.release()

    assert tokens == [1, 2, 3]
    assert fence_of(rows.db, fenced, key) == 3


def test_schedule_slots_have_their_own_tokens(
    driver: Driver, make_context: MakeContext, rows: Rows, fenced: tuple[str, str]
) -> None:
    first = driver.hold(make_context(fencing=True, schedule=YEARLY, **LEASE), ["schedule", "lease"])
    assert first.fencing_token() == 1  # the lease's token
    first.release()
    rows.expire(schedule_key(make_context().lock_key))
    second = driver.hold(make_context(fencing=True, schedule=YEARLY), ["schedule"])
    assert second.fencing_token() == 2  # the slot's own counter
    second.release()


def test_token_and_lock_key_reach_the_wrapped_command(
    driver: Driver, make_context: MakeContext, fenced: tuple[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "env"
    context = make_context(fencing=True, **LEASE)
    script = f'echo "$DISLOCK_LOCK_KEY $DISLOCK_FENCING_TOKEN $DISLOCK_RUN_TOKEN" > "{out}"'
    assert driver.run_with_locks(["sh", "-c", script], context, ["lease"]) == 0
    key, fence, first_run = out.read_text().split()
    assert (key, fence) == (context.lock_key, "1")
    assert driver.run_with_locks(["sh", "-c", script], context, ["lease"]) == 0
    key, fence, second_run = out.read_text().split()
    assert (key, fence) == (context.lock_key, "2")
    # Each run has a token of its own (what its guard would find it by).
    assert len(first_run) == 16 and first_run != second_run


def test_without_fencing_no_token_is_exported(
    driver: Driver, make_context: MakeContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISLOCK_FENCING_TOKEN", "999")  # a stale one from an outer run
    out = tmp_path / "env"
    script = f'echo "$DISLOCK_LOCK_KEY:${{DISLOCK_FENCING_TOKEN-unset}}" > "{out}"'
    context = make_context(**LEASE)
    assert driver.run_with_locks(["sh", "-c", script], context, ["lease"]) == 0
    assert out.read_text().strip() == f"{context.lock_key}:unset"
