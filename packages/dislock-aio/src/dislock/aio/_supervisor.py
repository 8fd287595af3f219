"""``run_with_locks``: run a command under locks, as a supervisor.

The asyncio module ``dislock/aio/_supervisor.py`` is the hand-written source; the
sync ``dislock/_sync/_supervisor.py`` is generated from it by
``tools/async_to_sync.py``.

The command runs in its own process group so that the whole group can be
signalled: on lease loss under ``TERMINATE`` it gets SIGTERM, then SIGKILL after
``KILL_GRACE`` seconds, and the wrapper returns 75.  On Linux the command also
gets SIGKILL if the wrapper dies, since its lease will then expire and another
machine may start the same job.  Locks are released only after the command has
exited.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from time import monotonic

from dislock.core.config import SCHEDULE
from dislock.core.context import LEASE_LOST_EXIT_CODE, LeaseLossPolicy, LockContext
from dislock.core.errors import Interrupted, LeaseLostError
from dislock.core.supervision import (
    KILL_GRACE,
    POLL_INTERVAL,
    check_command,
    child_environment,
    exit_status,
)

from ._compat import Child, handling_signals, interrupting
from ._locks import LeaseLock, LockSession, acquire_locks

logger = logging.getLogger("dislock")

_PR_SET_PDEATHSIG = 1


def _parent_death_signal() -> Callable[[], None] | None:
    """A pre-exec hook asking Linux to SIGKILL the child when this process dies."""
    if not sys.platform.startswith("linux"):
        return None
    # Resolved here, before fork: the child must only make the call.  The
    # process's own symbols include libc's (no ldconfig lookup needed).
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return die_with_parent


def ensure_runnable(program: str) -> None:
    """Raise FileNotFoundError or PermissionError now, as starting it later would."""
    if os.sep in program:
        if not os.path.exists(program):
            raise FileNotFoundError(errno.ENOENT, "no such file", program)
        if os.path.isdir(program) or not os.access(program, os.X_OK):
            raise PermissionError(errno.EACCES, "not executable", program)
    elif shutil.which(program) is None:
        raise FileNotFoundError(errno.ENOENT, "command not found", program)


def signal_group(pgid: int, signum: int) -> None:
    """Signal a process group that may already be gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


async def stop_group(child: Child, grace: float = KILL_GRACE) -> int:
    """SIGTERM the child's group, SIGKILL it after ``grace``; the child's return code."""
    signal_group(child.pid, signal.SIGTERM)
    code = await child.wait(grace)
    # Whatever is left of the group (helpers ignoring SIGTERM) must not outlive
    # the lock either.
    signal_group(child.pid, signal.SIGKILL)
    if code is None:
        code = await child.wait(None)
    assert code is not None
    return code


async def supervise(
    argv: Sequence[str],
    session: LockSession,
    policy: LeaseLossPolicy,
    forward_signals: Iterable[int] = (),
) -> int:
    """Run ``argv`` while ``session``'s locks are held; its exit status, or 75."""
    env = child_environment(os.environ, session.locks[0].context.lock_key, session.fencing_token)
    lease = session.lease
    if lease is not None and lease.is_lost():
        return LEASE_LOST_EXIT_CODE  # lost before the command could even start
    child = await Child.start(list(argv), env, _parent_death_signal())

    def forward(signum: int) -> None:
        logger.info("forwarding signal %d to process group %d", signum, child.pid)
        signal_group(child.pid, signum)

    try:
        with handling_signals(forward_signals, forward):
            return await _watch(child, argv, lease, policy)
    except BaseException:
        # Interrupted (KeyboardInterrupt, cancellation): never leave the command
        # running after its locks are released, not even if interrupted again.
        try:
            await stop_group(child)
        finally:
            signal_group(child.pid, signal.SIGKILL)
        raise


async def _watch(
    child: Child, argv: Sequence[str], lease: LeaseLock | None, policy: LeaseLossPolicy
) -> int:
    while True:
        # Wake at the lease's deadline, not up to a poll interval after it: the
        # command must be stopping before its row can expire on the server.
        clock = lease.clock if lease is not None else None
        timeout = POLL_INTERVAL if clock is None else clock.until_deadline(monotonic())
        code = await child.wait(min(POLL_INTERVAL, max(timeout, 0.001)))
        if code is not None:
            return exit_status(code)
        if lease is not None and lease.is_lost():
            if policy is LeaseLossPolicy.TERMINATE:
                logger.error(
                    "lease lost; terminating %s (pid %d, SIGKILL after %g s)",
                    argv[0],
                    child.pid,
                    KILL_GRACE,
                )
                await stop_group(child)
                return LEASE_LOST_EXIT_CODE
            lease = None  # CONTINUE: the lock logged the loss; stop checking


async def run_with_locks(
    command: Sequence[str],
    *,
    context: LockContext,
    strategies: str | Iterable[str] = (SCHEDULE,),
    forward_signals: Iterable[int] = (),
) -> int:
    """Acquire the locks, run ``command`` and return its exit status.

    Returns the command's exit code (128+n if signal n killed it), or
    ``LEASE_LOST_EXIT_CODE`` (75) when the lease was lost under ``TERMINATE``.
    Raises ``LockNotAcquiredError`` when another owner holds a lock, without
    running the command, and FileNotFoundError or PermissionError, before taking
    any lock, when the command cannot be run.

    The command's environment also holds ``DISLOCK_LOCK_KEY`` and, with
    ``LockContext.fencing``, ``DISLOCK_FENCING_TOKEN``.

    ``forward_signals`` (e.g. ``dislock.core.supervision.FORWARDED_SIGNALS``) are
    caught while the command runs and passed on to its process group, so that
    the locks are released only once it has exited; this needs the main thread.
    Before the command starts (during the jitter, or while waiting for a lock),
    one of them ends the wait at once and 128 + its number is returned.
    """
    argv = check_command(command)
    ensure_runnable(argv[0])  # before locking: a typo must not use up a schedule slot
    signals = tuple(forward_signals)
    try:
        async with AsyncExitStack() as stack:
            # Until the command starts, the same signals end the wait for the
            # locks at once: nothing runs yet that they could be passed on to.
            async with interrupting(signals):
                session = await stack.enter_async_context(acquire_locks(context, strategies))
            return await supervise(argv, session, context.lease_loss_policy, signals)
    except LeaseLostError as exc:
        logger.error("%s", exc)
        return LEASE_LOST_EXIT_CODE
    except Interrupted as exc:
        logger.info("signal %d before %s started; not running it", exc.signum, argv[0])
        return 128 + exc.signum
