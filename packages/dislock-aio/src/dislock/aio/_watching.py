"""Watching a wrapped command until it ends, or must be stopped: its lease lost
(under ``TERMINATE``), its maximum runtime over (``Bound``), or its guard having
killed it; the wrapper's exit status, said in one line when it is not the command's.
And stopping its process group: SIGTERM, SIGKILL after a grace, and waiting until no
process of the group is left, for the lock must not be released while part of the
job still runs."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Sequence
from time import monotonic
from typing import NamedTuple

from dislock.core.context import LEASE_LOST_EXIT_CODE, MAX_RUNTIME_EXIT_CODE, LeaseLossPolicy
from dislock.core.observing import note
from dislock.core.processes import Guard, group_alive, signal_group
from dislock.core.supervision import (
    GUARD_FIRED,
    KILL_GRACE,
    exit_status,
    lease_loss_line,
    loss_grace,
    max_runtime_line,
)

from ._compat import Child, sleep
from ._lease import LeaseLock

logger = logging.getLogger("dislock")

_GUARD_VERDICT_PATIENCE = 0.5
"""How long a wrapper whose command was SIGKILLed, or that woke past the instant
its guard was to kill (it was stopped), waits for its guard to say whether it
killed the group (the guard exits right after killing)."""


class Bound(NamedTuple):
    """A run's maximum runtime: the lock key it is reported under, the bound, when
    (monotonic) it is over, and how long after its grace the guard kills."""

    lock_key: str
    seconds: float
    stop_at: float
    guard_lag: float

    def line(self, consequence: str) -> str:
        return max_runtime_line(self.lock_key, self.seconds, consequence)


def _terminating(argv: Sequence[str], child: Child, status: int, grace: float = KILL_GRACE) -> str:
    return f"terminating {argv[0]} (pid {child.pid}, SIGKILL after {grace:.3g} s), exit {status}"


def _guard_killed(argv: Sequence[str], child: Child, status: int) -> str:
    return f"its guard killed the process group of {argv[0]} (pid {child.pid}), exit {status}"


async def watch(
    child: Child,
    argv: Sequence[str],
    lease: LeaseLock | None,
    policy: LeaseLossPolicy,
    guard: Guard | None,
    lag: float,
    bound: Bound | None,
) -> tuple[int, bool]:
    """The wrapper's exit status once the command is over, and whether it was
    stopped for running past its bound."""
    while True:
        deadline: float | None = None
        wake = None if bound is None else bound.stop_at
        if lease is None:
            code = await child.wait(None if wake is None else max(wake - monotonic(), 0.001))
        else:
            # Woken by the loss itself, as soon as it is known; and at the
            # lease's deadline, in case nothing could declare it by then: the
            # command must be stopping before its row can expire on the server.
            deadline = lease.deadline
            if deadline is not None:
                wake = deadline if wake is None else min(wake, deadline)
            timeout = None if wake is None else max(wake - monotonic(), 0.001)
            code = await child.wait_or(lease.lease_lost, timeout)
        following = lease is not None and policy is LeaseLossPolicy.TERMINATE
        if guard is not None and (following or bound is not None):
            # A command SIGKILLed may be the guard's doing: it exits right after.
            # So may one not yet seen dead when we woke past the guard's instant
            # (the wrapper was stopped): its exit may not have been reaped yet.
            now = monotonic()
            overdue = (following and deadline is not None and now >= deadline + lag) or (
                bound is not None and now >= bound.stop_at + KILL_GRACE
            )
            killed = code == -signal.SIGKILL
            patience = _GUARD_VERDICT_PATIENCE if killed or overdue else 0.0
            # Whether the guard killed the group because a deadline passed.
            if await until(lambda: guard.verdict() is not None, patience) and guard.verdict():
                if code is None:
                    await child.wait(None)  # SIGKILLed: it is going, if not gone
                # Which instant the guard kept: the bound's, unless the lease's
                # deadline came first.
                if bound is not None and (
                    not following or deadline is None or bound.stop_at + KILL_GRACE < deadline
                ):
                    logger.error(
                        "%s", bound.line(_guard_killed(argv, child, MAX_RUNTIME_EXIT_CODE))
                    )
                    return MAX_RUNTIME_EXIT_CODE, True
                assert lease is not None
                lease.declare_if_lost()
                report_loss(lease, _guard_killed(argv, child, LEASE_LOST_EXIT_CODE), GUARD_FIRED)
                return LEASE_LOST_EXIT_CODE, False
        if code is not None:
            return exit_status(code), False
        if lease is not None and lease.declare_if_lost():
            if policy is LeaseLossPolicy.TERMINATE:
                deadline = lease.deadline
                grace = loss_grace(
                    lease.replacing, None if deadline is None else deadline - monotonic()
                )
                consequence = _terminating(argv, child, LEASE_LOST_EXIT_CODE, grace)
                line = lease_loss_line(lease.context.lock_key, lease.lost_reason, consequence)
                note("lease_lost", reason=lease.lost_reason)
                await terminate(child, guard, lag, line, grace)
                return LEASE_LOST_EXIT_CODE, False
            report_loss(lease, f"{argv[0]} keeps running (lease loss policy: continue)")
            lease = None  # CONTINUE: stop checking
        if bound is not None and monotonic() >= bound.stop_at:
            line = bound.line(_terminating(argv, child, MAX_RUNTIME_EXIT_CODE))
            await terminate(child, guard, bound.guard_lag, line)
            return MAX_RUNTIME_EXIT_CODE, True


def report_loss(lease: LeaseLock, consequence: str, reason: str | None = None) -> None:
    """The one line that says a lease was lost (for ``reason``, by default its own)
    and what happens to the command."""
    why = lease.lost_reason if reason is None else reason
    note("lease_lost", reason=why)
    logger.error("%s", lease_loss_line(lease.context.lock_key, why, consequence))


_GROUP_POLL = 0.02
"""How often the wrapper looks whether a process group it is stopping is gone."""


async def until(done: Callable[[], bool], timeout: float) -> bool:
    """Whether ``done()`` came true within ``timeout`` seconds (asked at once, then
    every ``_GROUP_POLL``)."""
    deadline = monotonic() + timeout
    while not done():
        if monotonic() >= deadline:
            return False
        await sleep(_GROUP_POLL)
    return True


async def _stop_rest(pgid: int, grace: float) -> bool:
    """SIGTERM the group ``pgid``, SIGKILL it after ``grace``; whether it is gone."""
    signal_group(pgid, signal.SIGTERM)
    if await until(lambda: not group_alive(pgid), grace):
        return True
    signal_group(pgid, signal.SIGKILL)
    return await until(lambda: not group_alive(pgid), 1.0)


async def clear_group(pgid: int, grace: float = KILL_GRACE) -> None:
    """SIGTERM what is left of a group whose leader exited, SIGKILL it after
    ``grace``, and wait until it is gone (see the module)."""
    if not group_alive(pgid):
        return
    logger.warning(
        "the command exited but processes of its group %d still run; terminating them "
        "(SIGKILL after %g s)",
        pgid,
        grace,
    )
    if not await _stop_rest(pgid, grace):
        logger.error("process group %d survived SIGKILL (a member this user cannot kill)", pgid)


async def stop_group(child: Child, grace: float = KILL_GRACE, line: str | None = None) -> int:
    """SIGTERM the child's group, SIGKILL it after ``grace``; the child's return code.
    ``line`` is said once the signal is sent: a wrapper blocked writing it (a full
    stderr pipe) must not hold the command's stop up."""
    started = monotonic()
    signal_group(child.group, signal.SIGTERM)
    if line is not None:
        logger.error("%s", line)
    code = await child.wait(max(0.0, grace - (monotonic() - started)))
    if code is None:
        signal_group(child.group, signal.SIGKILL)
        code = await child.wait(None)
    assert code is not None
    # Whatever is left of the group (helpers ignoring SIGTERM) must go too.
    if group_alive(child.group):
        await _stop_rest(child.group, max(0.0, grace - (monotonic() - started)))
    return code


async def terminate(
    child: Child, guard: Guard | None, lag: float, line: str, grace: float = KILL_GRACE
) -> None:
    """The wrapper stops the command itself (``stop_group``), and tells the guard
    first to wait out the grace and ``lag``."""
    if guard is not None:
        guard.kill_at(monotonic() + grace + lag)
    await stop_group(child, grace, line)
