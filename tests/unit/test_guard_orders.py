"""What the command's guard makes of the wrapper's lines, and when it kills."""

from __future__ import annotations

import math

import pytest

from dislock.core.guard import DONE, Orders, group_line, until_line
from dislock.core.lease_clock import safety_margin
from dislock.core.supervision import GUARD_LAG_MAX, guard_lag


def test_lines_split_anywhere_are_read_whole() -> None:
    orders = Orders()
    data = group_line(4242) + until_line(100.25)
    for i in range(len(data)):
        orders.feed(data[i : i + 1])
    assert orders.group == 4242
    assert orders.kill_at == 100.25
    assert not orders.done
    assert orders.timeout(100.0) == pytest.approx(0.25)
    assert orders.timeout(101.0) == 0.0  # passed: kill now


def test_the_kill_instant_only_moves_later() -> None:
    """The renewer and the wrapper's main thread may send in either order: a
    renewal's deadline arriving after the wrapper asked for its grace changes nothing."""
    orders = Orders()
    orders.feed(until_line(50.0) + until_line(60.0) + until_line(55.0))
    assert orders.kill_at == 60.0
    orders.feed(until_line(math.inf) + until_line(70.0))
    assert orders.kill_at == math.inf
    assert orders.timeout(1e9) is None  # never


def test_without_a_deadline_the_guard_waits_for_ever() -> None:
    """A schedule-only run has no lease, so no deadline: only the wrapper's death kills."""
    orders = Orders()
    orders.feed(group_line(7))
    assert orders.timeout(0.0) is None


@pytest.mark.parametrize("line", [b"until nan\n", b"until soon\n", b"group x\n", b"what\n"])
def test_lines_the_wrapper_never_sends_change_nothing(line: bytes) -> None:
    orders = Orders()
    orders.feed(until_line(10.0) + group_line(3) + line)
    assert (orders.group, orders.kill_at, orders.done) == (3, 10.0, False)


def test_done_stands_the_guard_down() -> None:
    orders = Orders()
    orders.feed(group_line(3) + DONE)
    assert orders.done


@pytest.mark.parametrize("ttl", [0.5, 2.0, 3.0, 5.0, 60.0, 3600.0])
def test_the_guard_kills_before_the_row_can_expire(ttl: float) -> None:
    """At most 0.25 s after the local deadline, and before the safety margin (which
    separates the deadline from the row's expiry on the server) has run out."""
    lag = guard_lag(ttl)
    assert 0 < lag <= GUARD_LAG_MAX
    assert lag < safety_margin(ttl)
