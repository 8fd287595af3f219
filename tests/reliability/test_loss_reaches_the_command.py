"""A lost lease reaches the wrapped command at once: SIGTERM within 50 ms of the loss
being known, sync and asyncio alike (the supervisor wakes on the loss event itself).

This is one of the few tests that assert a latency, because the issue asks for one
(#12). The loss's moment is taken where the lock code declares it; the command's
receipt is the first thing its SIGTERM handler does. Measured here on a loaded
2-core machine: a few milliseconds; the 50 ms bound is the requirement itself.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dislock
import dislock._sync._renewer
import dislock.aio
import dislock.aio._renewer
from dislock import LEASE_LOST_EXIT_CODE, LockContext
from dislock.core.rows import lease_key
from tests.support.eventually import wait_for
from tests.support.rows import Rows
from tests.support.supervising import supervise_losing_the_lease

BOUND = 0.050

CHILD = """\
import pathlib, signal, sys, time
def on_term(signum, frame):
    now = time.time()
    pathlib.Path(sys.argv[2]).write_text(repr(now))
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
pathlib.Path(sys.argv[1]).touch()
while True:
    time.sleep(1)
"""


@pytest.fixture
def loss_times(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Wall-clock times at which the lock code declared a lease lost."""
    times: list[float] = []
    for renewer in (dislock._sync._renewer.Renewer, dislock.aio._renewer.Renewer):
        original: Callable[..., None] = renewer.declare_lost

        def recording(self: Any, renewal: Any, _original: Any = original) -> None:
            now = time.time()
            event = self._lost_events.get(renewal)
            was_set = event is None or event.is_set()
            _original(self, renewal)
            if not was_set and event.is_set():
                times.append(now)

        monkeypatch.setattr(renewer, "declare_lost", recording)
    return times


def context(make_context: Callable[..., LockContext]) -> LockContext:
    # Renewals every 0.2 s find the stolen row soon; the TTL leaves the local
    # deadline far away, so that it is the renewal that declares the loss.
    return make_context(run_ttl_seconds=10, lease_interval_seconds=0.2)


def latency(loss_times: list[float], term: Path) -> float:
    assert len(loss_times) == 1
    return float(term.read_text()) - loss_times[0]


@pytest.mark.parametrize("flavour", ["sync", "aio"])
def test_the_command_gets_sigterm_within_50_ms_of_the_loss(
    make_context: Callable[..., LockContext],
    rows: Rows,
    tmp_path: Path,
    loss_times: list[float],
    flavour: str,
) -> None:
    ready, term = tmp_path / "ready", tmp_path / "term"
    ctx = context(make_context)
    argv = [sys.executable, "-c", CHILD, str(ready), str(term)]

    def steal() -> None:
        wait_for(ready)
        time.sleep(0.3)  # the supervisor is asleep, waiting
        rows.steal(lease_key(ctx.lock_key))

    assert supervise_losing_the_lease(flavour, ctx, argv, steal) == LEASE_LOST_EXIT_CODE
    measured = latency(loss_times, term)
    print(f"{flavour}: SIGTERM {measured * 1000:.1f} ms after the loss")
    assert 0 <= measured < BOUND
