"""Contract: ``replace`` (``LOCK_REPLACE=1``) takes a lease over from its running holder,
on every implementation: the holder loses the lease, told by whom, and the replacer's
work starts once the holder has left its block (or its command's group is gone)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dislock import LeaseLostError, LockContext, LockNotAcquiredError
from dislock.core.errors import ConfigurationError
from dislock.core.rows import lease_key
from tests.support.drivers import Driver
from tests.support.rows import Rows

MakeContext = Callable[..., LockContext]
LEASE = {"run_ttl_seconds": 5.0, "lease_interval_seconds": 0.3}


def _replacing(
    driver: Driver, context: LockContext, started: Path
) -> tuple[threading.Thread, list[object]]:
    """``run_with_locks`` of ``context`` in a thread, its command writing the time it
    started (ns, the realtime clock): the thread and, once it ends, its status."""
    outcome: list[object] = []

    def run() -> None:
        try:
            command = ["sh", "-c", f'date +%s%N > "{started}"']
            outcome.append(driver.run_with_locks(command, context, ["lease"]))
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_the_holder_is_told_who_replaced_it_and_the_replacer_runs_after_it(
    driver: Driver, make_context: MakeContext, rows: Rows, tmp_path: Path
) -> None:
    holder = make_context(**LEASE)
    replacer = make_context(replace=True, **LEASE)
    started = tmp_path / "started"
    holding = driver.hold(holder, ["lease"])
    thread, outcome = _replacing(driver, replacer, started)
    try:
        assert holding.wait_lease_lost(30), "the holder was not told to stop"
        if driver.name != "cli":  # (a wrapper has left once its loss shows)
            assert not started.exists(), "the replacer started while the holder's block ran"
        left_at = time.time_ns()
        with pytest.raises(LeaseLostError) as lost:
            holding.release()
    finally:
        thread.join(60)
    assert outcome == [0], outcome
    assert "replaced by " in str(lost.value), lost.value
    if driver.name != "cli":
        # The replacer's owner token, as written (the wrapper makes its own).
        assert f"replaced by {replacer.owner} on " in str(lost.value), lost.value
        # A Python block leaves when the test says: the replacer waited for it.
        assert int(started.read_text()) > left_at
    row = rows.get(lease_key(holder.lock_key))
    assert row is not None and row.expired  # the replacer's run released it


def test_a_free_lease_is_simply_taken(
    driver: Driver, make_context: MakeContext, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    thread, outcome = _replacing(driver, make_context(replace=True, **LEASE), started)
    thread.join(60)
    assert outcome == [0] and started.exists(), outcome


def test_a_holder_that_never_hands_over_is_outlived_by_its_row(
    driver: Driver, make_context: MakeContext, tmp_path: Path
) -> None:
    """A holder whose lease is lost under ``continue`` does not stop: its row, no
    longer renewed, expires, and the replacer takes it then, not before."""
    from dislock import LeaseLossPolicy

    holder = make_context(lease_loss_policy=LeaseLossPolicy.CONTINUE, **LEASE)
    started = tmp_path / "started"
    holding = driver.hold(holder, ["lease"])
    began = time.monotonic()
    thread, outcome = _replacing(driver, make_context(replace=True, **LEASE), started)
    try:
        thread.join(60)
        took = time.monotonic() - began
    finally:
        holding.release()  # (continue: the loss is only logged)
    assert outcome == [0] and started.exists(), outcome
    # Not before the row expired: a TTL from the holder's last renewal.
    assert took >= LEASE["run_ttl_seconds"] - 2 * LEASE["lease_interval_seconds"], took


def test_replace_needs_a_lease_of_one_holder(driver: Driver, make_context: MakeContext) -> None:
    with pytest.raises((ConfigurationError, RuntimeError)) as refused:
        driver.run_with_locks(
            ["true"], make_context(replace=True, schedule="0 0 1 1 *"), ["schedule"]
        )
    assert "replacing the running holder needs the lease strategy" in str(refused.value)
    with pytest.raises(ConfigurationError, match="cannot be combined with 2 slots"):
        make_context(replace=True, slots=2, **LEASE)


@pytest.mark.needs("python-api")
def test_a_second_replacer_is_refused_while_the_first_waits(
    driver: Driver, make_context: MakeContext, tmp_path: Path
) -> None:
    """While one replacer waits for the hand-over, another is refused as by a held
    lease (the first one asked first).  (A block leaves when the test says, so the
    wait can be held open: a wrapper hands over as soon as its command is gone.)"""
    holder = make_context(**LEASE)
    holding = driver.hold(holder, ["lease"])
    started = tmp_path / "started"
    thread, outcome = _replacing(driver, make_context(replace=True, **LEASE), started)
    try:
        assert holding.wait_lease_lost(30)
        with pytest.raises(LockNotAcquiredError):
            driver.run_with_locks(["true"], make_context(replace=True, **LEASE), ["lease"])
    finally:
        with pytest.raises(LeaseLostError):
            holding.release()
        thread.join(60)
    assert outcome == [0], outcome
