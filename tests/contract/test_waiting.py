"""Contract: waiting for a lease held elsewhere, and leases with N slots.

Through PgBouncer in transaction pooling (CI runs this suite behind it) a waiter
cannot hear a release and polls; the tests that prove the ``NOTIFY`` wake-up are
marked ``direct_postgres``.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from dislock import ConfigurationError, LockContext, LockNotAcquiredError
from dislock.core.kinds import kind
from dislock.core.rows import lease_key, schedule_key
from tests.support.drivers import CliDriver, Driver
from tests.support.eventually import eventually
from tests.support.rows import Rows
from tests.support.waiting import refusals

MakeContext = Callable[..., LockContext]
LEASE = {"run_ttl_seconds": 3.0, "lease_interval_seconds": 0.5}
YEARLY = "0 0 1 1 *"


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=8) as executor:
        yield executor


def touch(path: Path) -> list[str]:
    return ["sh", "-c", f'touch "{path}"']


def start_waiter(
    pool: ThreadPoolExecutor,
    driver: Driver,
    context: LockContext,
    marker: Path,
    strategies: tuple[str, ...] = ("lease",),
) -> tuple[Future[int], float]:
    started = time.monotonic()
    return pool.submit(driver.run_with_locks, touch(marker), context, list(strategies)), started


def test_a_waiter_runs_once_the_holder_releases(
    driver: Driver,
    make_context: MakeContext,
    pool: ThreadPoolExecutor,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waiting = refusals(driver, monkeypatch)
    holder = driver.hold(make_context(**LEASE), ["lease"])
    marker = tmp_path / "ran"
    waiter, _ = start_waiter(pool, driver, make_context(**LEASE, wait_seconds=30), marker)
    waiting()
    assert not marker.exists() and not waiter.done()  # it waits, it does not skip
    holder.release()
    assert waiter.result(timeout=30) == 0
    assert marker.exists()


def test_a_waiter_gives_up_when_its_wait_is_over(
    driver: Driver, make_context: MakeContext, tmp_path: Path
) -> None:
    holder = driver.hold(make_context(**LEASE), ["lease"])
    marker = tmp_path / "ran"
    started = time.monotonic()
    with pytest.raises(LockNotAcquiredError):
        driver.run_with_locks(touch(marker), make_context(**LEASE, wait_seconds=1.0), ["lease"])
    waited = time.monotonic() - started
    holder.release()
    assert not marker.exists()
    # At least the wait; at most the wait plus a start-up and a last try (loaded machine).
    assert 1.0 <= waited < 1.0 + 10.0


def test_polling_alone_hands_the_lease_over(
    driver: Driver,
    make_context: MakeContext,
    pool: ThreadPoolExecutor,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waiting = refusals(driver, monkeypatch)
    holder = driver.hold(make_context(**LEASE), ["lease"])
    marker = tmp_path / "ran"
    context = make_context(**LEASE, wait_seconds=30, wait_listen=False, wait_poll_seconds=0.2)
    waiter, _ = start_waiter(pool, driver, context, marker)
    waiting()
    assert not waiter.done()
    holder.release()
    assert waiter.result(timeout=30) == 0 and marker.exists()


@pytest.mark.direct_postgres
def test_a_release_wakes_the_waiter_before_its_next_poll(
    driver: Driver,
    make_context: MakeContext,
    pool: ThreadPoolExecutor,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waiting = refusals(driver, monkeypatch)
    # Polls 30 s apart (jittered, never sooner than 15 s): only the release's
    # NOTIFY can hand the lease over within seconds.
    holder = driver.hold(make_context(**LEASE), ["lease"])
    marker = tmp_path / "ran"
    context = make_context(**LEASE, wait_seconds=60, wait_poll_seconds=30)
    waiter, _ = start_waiter(pool, driver, context, marker)
    waiting()
    released = time.monotonic()
    holder.release()
    assert waiter.result(timeout=60) == 0
    assert time.monotonic() - released < 10.0


def test_a_holder_that_died_is_found_by_polling(
    driver: Driver, make_context: MakeContext, rows: Rows, tmp_path: Path
) -> None:
    context = make_context(**LEASE, wait_seconds=30)
    # A crashed holder: its row, no renewer, no release; it expires in 1.5 s.
    rows.plant(lease_key(context.lock_key), "crashed", 1.5)
    marker = tmp_path / "ran"
    assert driver.run_with_locks(touch(marker), context, ["lease"]) == 0
    assert marker.exists()


def test_waiting_for_a_schedule_slot_alone_is_a_configuration_error(
    driver: Driver, make_context: MakeContext
) -> None:
    with pytest.raises(ConfigurationError, match="lease"):
        driver.hold(make_context(schedule=YEARLY, wait_seconds=5), ["schedule"])


def test_schedule_lease_takes_the_slot_once_then_waits_for_the_lease(
    driver: Driver,
    make_context: MakeContext,
    pool: ThreadPoolExecutor,
    rows: Rows,
    tmp_path: Path,
) -> None:
    holder = driver.hold(make_context(**LEASE), ["lease"])
    marker = tmp_path / "ran"
    context = make_context(**LEASE, schedule=YEARLY, wait_seconds=30)
    waiter, _ = start_waiter(pool, driver, context, marker, ("schedule", "lease"))
    slot = eventually(
        lambda: rows.get(schedule_key(context.lock_key)), message="the slot was never taken"
    )
    assert not slot.expired  # taken while the lease is still held
    assert not waiter.done()
    holder.release()
    assert waiter.result(timeout=30) == 0 and marker.exists()
    # The slot is used up: a second start in it skips, waiting or not.
    with pytest.raises(LockNotAcquiredError):
        driver.run_with_locks(touch(tmp_path / "again"), context, ["schedule", "lease"])
    assert not (tmp_path / "again").exists()


@pytest.mark.needs("wrapper")
@pytest.mark.parametrize("wait", [0.0, 1.0])
def test_conflict_exit_code_when_held_after_any_wait(
    driver: Driver, make_context: MakeContext, tmp_path: Path, wait: float
) -> None:
    assert isinstance(driver, CliDriver)
    holder = driver.hold(make_context(**LEASE), ["lease"])
    marker = tmp_path / "ran"
    context = make_context(**LEASE, wait_seconds=wait)
    process = driver.start(touch(marker), context, ["lease"], {"LOCK_CONFLICT_EXIT_CODE": "3"})
    _, stderr = process.communicate(timeout=60)
    holder.release()
    assert process.returncode == 3, stderr
    assert not marker.exists()
    # Unset, a conflict is still the quiet 0 of a cron job that had nothing to do.
    plain = driver.start(touch(marker), make_context(**LEASE), ["lease"])
    free_stderr = plain.communicate(timeout=60)[1]
    assert plain.returncode == 0 and marker.exists(), free_stderr


@pytest.mark.needs("wrapper")
def test_a_signal_while_waiting_exits_128_plus_n_without_running(
    driver: Driver, make_context: MakeContext, tmp_path: Path
) -> None:
    assert isinstance(driver, CliDriver)
    holder = driver.hold(make_context(**LEASE), ["lease"])
    marker = tmp_path / "ran"
    process = driver.start(touch(marker), make_context(**LEASE, wait_seconds=60), ["lease"])
    assert process.stderr is not None
    seen = ""
    while "waiting up to 60 s" not in seen:
        line = process.stderr.readline()
        assert line, seen
        seen += line
    process.send_signal(signal.SIGTERM)
    try:
        assert process.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        process.kill()
        process.communicate()
        holder.release()
    assert not marker.exists()


# --- N slots ------------------------------------------------------------------


def test_n_slots_admit_n_holders_and_no_more(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    holders = [driver.hold(make_context(**LEASE, slots=3), ["lease"]) for _ in range(3)]
    with pytest.raises(LockNotAcquiredError, match="3 slots"):
        driver.hold(make_context(**LEASE, slots=3), ["lease"])
    lock_key = make_context().lock_key
    lease = kind("lease")
    keys = [lease.row_key(lock_key, n) for n in (1, 2, 3)]
    assert keys[0] == lease_key(lock_key)  # slot 1 is the plain lease row
    for key in keys:
        row = rows.get(key)
        assert row is not None and not row.expired
    assert rows.get(lease.row_key(lock_key, 4)) is None

    holders[1].release()  # slot 2 frees, and is the one taken next
    assert rows.get(keys[1]) is not None and rows.get(keys[1]).expired  # type: ignore[union-attr]
    fourth = driver.hold(make_context(**LEASE, slots=3), ["lease"])
    row = rows.get(keys[1])
    assert row is not None and not row.expired
    for holding in (holders[0], holders[2], fourth):
        holding.release()
    assert all(rows.get(key).expired for key in keys)  # type: ignore[union-attr]


def test_each_slot_is_renewed_like_a_lease(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    # A TTL with room for stalled renewals on a loaded machine; the wait is well past it.
    ttl = {"run_ttl_seconds": 2.0, "lease_interval_seconds": 0.2}
    holders = [driver.hold(make_context(**ttl, slots=2), ["lease"]) for _ in range(2)]
    time.sleep(2.5 * ttl["run_ttl_seconds"])  # well past the TTL: only renewals keep both rows
    lock_key = make_context().lock_key
    for n in (1, 2):
        row = rows.get(kind("lease").row_key(lock_key, n))
        assert row is not None and not row.expired
    for holding in holders:
        assert not holding.lease_lost_event_set()
        holding.release()


def test_a_slot_stays_compatible_with_a_one_holder_lease(
    driver: Driver, make_context: MakeContext
) -> None:
    # dislock 0.1.0 (and LOCK_SLOTS=1) takes slot 1's row: it counts as a holder.
    plain = driver.hold(make_context(**LEASE), ["lease"])
    with pytest.raises(LockNotAcquiredError):
        driver.hold(make_context(**LEASE), ["lease"])
    second = driver.hold(make_context(**LEASE, slots=2), ["lease"])
    with pytest.raises(LockNotAcquiredError):
        driver.hold(make_context(**LEASE, slots=2), ["lease"])
    plain.release()
    second.release()


def test_a_waiter_takes_the_first_slot_that_frees(
    driver: Driver,
    make_context: MakeContext,
    pool: ThreadPoolExecutor,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waiting = refusals(driver, monkeypatch)
    holders = [driver.hold(make_context(**LEASE, slots=2), ["lease"]) for _ in range(2)]
    marker = tmp_path / "ran"
    waiter, _ = start_waiter(pool, driver, make_context(**LEASE, slots=2, wait_seconds=30), marker)
    waiting()
    assert not waiter.done()
    holders[0].release()
    assert waiter.result(timeout=30) == 0 and marker.exists()
    holders[1].release()


def test_slots_without_a_lease_are_a_configuration_error(
    driver: Driver, make_context: MakeContext
) -> None:
    with pytest.raises(ConfigurationError, match="slots"):
        driver.hold(make_context(schedule=YEARLY, slots=2), ["schedule"])


def test_no_lock_key_can_name_another_keys_slot(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    base = make_context().lock_key
    holders = [driver.hold(make_context(**LEASE, slots=2), ["lease"]) for _ in range(2)]
    # Keys that look like a slot of `base` are locks of their own.
    others = [
        driver.hold(make_context(**LEASE, lock_key=key), ["lease"])
        for key in (f"{base}#2", f"lease#2:{base}", f"{base}:2")
    ]
    row = rows.get(kind("lease").row_key(base, 2))
    assert row is not None and not row.expired
    for holding in [*holders, *others]:
        holding.release()
