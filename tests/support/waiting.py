"""Knowing that a waiter has been refused and waits, for the contract tests of
waiting: the decision to wait (``WaitPlan.next_delay``, asked by both Python
flavours right after a refused try) is watched."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from dislock.core.waiting import WaitPlan
from tests.support.drivers import Driver

CLI_GRACE = 1.5
"""Seconds the CLI's waiter, another process that says nothing before it ends, is
given to take the lease or skip before a test checks it does neither."""


def refusals(driver: Driver, monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """A function that returns once a waiter started after this call has been
    refused and has decided to wait (on the Python drivers: from then on it waits,
    and nothing but a release or its wait's end lets it go on), and fails if it
    decided to give up; on the CLI's, after ``CLI_GRACE``, as it tells nothing
    sooner."""
    if driver.name == "cli":
        return lambda: time.sleep(CLI_GRACE)
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
