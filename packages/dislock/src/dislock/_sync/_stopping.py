# GENERATED from dislock-aio's dislock/aio/_stopping.py by tools/async_to_sync.py: do not edit.
# Change the asyncio source, then run `hatch run generate`.
"""Stopping a wrapped command's process group: SIGTERM, SIGKILL after a grace, and
waiting until no process of the group is left, for the lock must not be released
while part of the job still runs."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from time import monotonic

from dislock.core.processes import Guard, group_alive, signal_group
from dislock.core.supervision import KILL_GRACE

from ._compat import Child, sleep

logger = logging.getLogger("dislock")

_GROUP_POLL = 0.02
"""How often the wrapper looks whether a process group it is stopping is gone."""


def until(done: Callable[[], bool], timeout: float) -> bool:
    """Whether ``done()`` came true within ``timeout`` seconds (asked at once, then
    every ``_GROUP_POLL``)."""
    deadline = monotonic() + timeout
    while not done():
        if monotonic() >= deadline:
            return False
        sleep(_GROUP_POLL)
    return True


def _group_gone(pgid: int, timeout: float) -> bool:
    return until(lambda: not group_alive(pgid), timeout)


def clear_group(pgid: int, grace: float = KILL_GRACE) -> None:
    """SIGTERM what is left of a group whose leader exited, SIGKILL it after
    ``grace``, and wait until it is gone: the lock must not be released while
    part of the job still runs."""
    if not group_alive(pgid):
        return
    logger.warning(
        "the command exited but processes of its group %d still run; terminating them "
        "(SIGKILL after %g s)",
        pgid,
        grace,
    )
    signal_group(pgid, signal.SIGTERM)
    if _group_gone(pgid, grace):
        return
    signal_group(pgid, signal.SIGKILL)
    if not _group_gone(pgid, 1.0):
        logger.error("process group %d survived SIGKILL (a member this user cannot kill)", pgid)


def stop_group(child: Child, grace: float = KILL_GRACE) -> int:
    """SIGTERM the child's group, SIGKILL it after ``grace``; the child's return code."""
    started = monotonic()
    signal_group(child.group, signal.SIGTERM)
    return finish_stop(child, grace, started)


def finish_stop(child: Child, grace: float, started: float) -> int:
    """The rest of ``stop_group``, once the group got SIGTERM at ``started``."""
    code = child.wait(max(0.0, grace - (monotonic() - started)))
    if code is None:
        signal_group(child.group, signal.SIGKILL)
        code = child.wait(None)
    assert code is not None
    # Whatever is left of the group (helpers ignoring SIGTERM) must not outlive
    # the lock either.
    if group_alive(child.group):
        signal_group(child.group, signal.SIGTERM)
        if not _group_gone(child.group, max(0.0, grace - (monotonic() - started))):
            signal_group(child.group, signal.SIGKILL)
            _group_gone(child.group, 1.0)
    return code


def terminate(
    child: Child, guard: Guard | None, lag: float, line: str, grace: float = KILL_GRACE
) -> None:
    """The wrapper stops the command itself (SIGTERM, SIGKILL after ``grace``), and
    tells the guard to wait out the grace and ``lag``.  ``line`` is said once the
    signal is sent: a wrapper blocked writing it (a full stderr pipe) must not hold
    the command's stop up."""
    started = monotonic()
    if guard is not None:
        guard.kill_at(started + grace + lag)
    signal_group(child.group, signal.SIGTERM)
    logger.error("%s", line)
    finish_stop(child, grace, started)
