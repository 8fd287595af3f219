"""Knowing that a waiter has been refused and waits, for the contract tests of
waiting: the decision to wait (``WaitPlan.next_delay``, asked by both Python
flavours right after a refused try) is watched; the CLI's waiter, another
process, says it on stderr (at INFO, as the driver runs it) once it was refused
and has begun to wait (its LISTEN, when it listens, already in place)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from dislock.core.waiting import WaitPlan
from tests.support.drivers import NOT_RUNNING, CliDriver, Driver
from tests.support.eventually import eventually

WAITS = "is held; waiting up to"
"""What the CLI's waiter logs once it was refused and waits (``dislock.aio._waiting``)."""


def refusals(driver: Driver, monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """A function that returns once a waiter started after this call has been
    refused and has decided to wait (from then on it waits, and nothing but a
    release or its wait's end lets it go on), and fails if it decided to give up."""
    if isinstance(driver, CliDriver):
        return _said_it_waits(driver)
    refused = threading.Event()
    decided: list[float | None] = []
    original = WaitPlan.next_delay

    def next_delay(self: WaitPlan, now: float, *, listening: bool) -> float | None:
        delay = original(self, now, listening=listening)
        decided.append(delay)
        refused.set()
        return delay

    monkeypatch.setattr(WaitPlan, "next_delay", next_delay)

    def wait() -> None:
        assert refused.wait(60), "the waiter was never refused, or never waited"
        assert decided[0] is not None, "the waiter gave up at its first refusal"

    return wait


def _said_it_waits(driver: CliDriver) -> Callable[[], None]:
    before = driver.stderr_logs()

    def said() -> str | None:
        for log in driver.stderr_logs() - before:
            text = log.read_text()
            if WAITS in text or NOT_RUNNING in text:
                return text
        return None

    def wait() -> None:
        text = eventually(said, timeout=60, message="the waiter said neither that it waits nor why")
        assert WAITS in text, f"the waiter gave up at its first refusal: {text}"

    return wait
