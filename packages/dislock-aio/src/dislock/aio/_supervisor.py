"""``run_with_locks``: run a command under locks, as a supervisor.

Hand-written in ``dislock/aio/_supervisor.py``; ``dislock/_sync/_supervisor.py`` is
generated from it by ``tools/async_to_sync.py``.

The command runs in its own process group so that the whole group can be
signalled: on lease loss under ``TERMINATE`` it gets SIGTERM, then SIGKILL after
``KILL_GRACE`` seconds, and the wrapper returns 75.  Locks are released only
once no process of the group is left: processes still running after the
command's own process exited get the same SIGTERM, then SIGKILL.

If the wrapper dies (SIGKILL, the OOM killer, a crash), its lease will expire
and another machine may start the same job, so the whole group must die with
it.  A wrapper can also stop without dying (SIGSTOP, a debugger, a write blocked
on a full pipe) while the row expires.  A guard (``dislock.core.guard``) covers
both: a small process of the wrapper's own interpreter, outside the group,
reading a pipe whose only writer is the wrapper.  The kernel closes the pipe
when the wrapper dies, however it dies; the guard then reads end-of-file and
SIGKILLs the group.  Under ``TERMINATE``, the renewer writes the lease's new
local deadline to it after each renewal; the guard SIGKILLs the group once that
deadline (and ``guard_lag`` more) passes without news, whatever the wrapper is
doing.  A wrapper that can still act stops the command itself at the deadline,
as before, and tells the guard to wait out the grace.  Both the guard and the
command are started without running Python in the forked child, which lets
Python use ``vfork``.  Where the guard cannot be started (no interpreter file to run, as in
a frozen application), the command falls back to the parent-death signal
(Linux), and no deadline binds it from outside.

The guard is told the group as soon as the command has started (its pid, since it
leads a session of its own).  A wrapper killed (or stopped past the deadline)
before that, however long a loaded machine holds it there, leaves the guard
without a group: the guard then finds the command by the run's token in its
environment (``RUN_TOKEN_VARIABLE``) and kills it and its group.  The group
cannot simply be made first with the command joining it: a member that is not
its group's leader may leave it (GNU ``timeout`` calls ``setpgid(0, 0)``), and
then neither signals nor the guard reach it.
"""

from __future__ import annotations

import logging
import math
import os
import signal
from collections.abc import Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from time import monotonic
from typing import NamedTuple

from dislock.core.config import SCHEDULE
from dislock.core.context import (
    LEASE_LOST_EXIT_CODE,
    MAX_RUNTIME_EXIT_CODE,
    LeaseLossPolicy,
    LockContext,
)
from dislock.core.errors import Interrupted, LeaseLostError
from dislock.core.history import end_of_command
from dislock.core.output_tail import OutputTails
from dislock.core.processes import (
    Guard,
    ensure_runnable,
    group_alive,
    parent_death_signal,
    signal_group,
)
from dislock.core.supervision import (
    GUARD_FIRED,
    GUARD_LAG_MAX,
    KILL_GRACE,
    SignalAction,
    SignalRoute,
    check_command,
    child_environment,
    exit_status,
    guard_lag,
    inherited_environment,
    lease_loss_line,
    loss_grace,
    max_runtime_line,
    new_run_token,
)

from ._compat import Child, handling_signals, interrupter, interrupting, sleep, to_thread
from ._lease import LeaseLock
from ._session import LockSession, acquire_unguarded, enter_exit_first

logger = logging.getLogger("dislock")

_GUARD_VERDICT_PATIENCE = 0.5
"""How long a wrapper whose command was SIGKILLed, or that woke past the instant
its guard was to kill (it was stopped), waits for its guard to say whether it
killed the group (the guard exits right after killing)."""
_GROUP_POLL = 0.02
"""How often the wrapper looks whether a process group it is stopping is gone."""


async def _until(done: Callable[[], bool], timeout: float) -> bool:
    """Whether ``done()`` came true within ``timeout`` seconds (asked at once, then
    every ``_GROUP_POLL``)."""
    deadline = monotonic() + timeout
    while not done():
        if monotonic() >= deadline:
            return False
        await sleep(_GROUP_POLL)
    return True


async def _guard_killed_at_deadline(guard: Guard, patience: float) -> bool:
    """Whether the guard killed the group because the deadline passed, waiting up
    to ``patience`` seconds for it to exit."""
    return await _until(lambda: guard.verdict() is not None, patience) and bool(guard.verdict())


async def _group_gone(pgid: int, timeout: float) -> bool:
    return await _until(lambda: not group_alive(pgid), timeout)


async def clear_group(pgid: int, grace: float = KILL_GRACE) -> None:
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
    if await _group_gone(pgid, grace):
        return
    signal_group(pgid, signal.SIGKILL)
    if not await _group_gone(pgid, 1.0):
        logger.error("process group %d survived SIGKILL (a member this user cannot kill)", pgid)


async def stop_group(child: Child, grace: float = KILL_GRACE) -> int:
    """SIGTERM the child's group, SIGKILL it after ``grace``; the child's return code."""
    started = monotonic()
    signal_group(child.group, signal.SIGTERM)
    return await _finish_stop(child, grace, started)


async def _finish_stop(child: Child, grace: float, started: float) -> int:
    """The rest of ``stop_group``, once the group got SIGTERM at ``started``."""
    code = await child.wait(max(0.0, grace - (monotonic() - started)))
    if code is None:
        signal_group(child.group, signal.SIGKILL)
        code = await child.wait(None)
    assert code is not None
    # Whatever is left of the group (helpers ignoring SIGTERM) must not outlive
    # the lock either.
    if group_alive(child.group):
        signal_group(child.group, signal.SIGTERM)
        if not await _group_gone(child.group, max(0.0, grace - (monotonic() - started))):
            signal_group(child.group, signal.SIGKILL)
            await _group_gone(child.group, 1.0)
    return code


async def supervise(
    argv: Sequence[str],
    session: LockSession,
    policy: LeaseLossPolicy,
    route: SignalRoute | None = None,
    withheld_variables: Iterable[str] = (),
) -> int:
    """Run ``argv`` while ``session``'s locks are held; its exit status, or 75.

    With ``route`` (whose handler ``run_with_locks`` has installed), the signals it
    kept before the command's process group existed are passed on as soon as it
    does, and the signals that arrive while the command runs go to its group.
    Neither the command nor its guard inherits ``withheld_variables``."""
    run_token = new_run_token()
    context = session.locks[0].context
    base = inherited_environment(os.environ, withheld_variables)
    env = child_environment(
        base,
        context.lock_key,
        session.fencing_token,
        run_token,
        attempt=session.attempt,
    )
    lease = session.lease
    try:
        if lease is not None and lease.declare_if_lost():
            # Lost before the command could even start.
            _report_loss(lease, f"not starting {argv[0]}, exit {LEASE_LOST_EXIT_CODE}")
            session.run_end = end_of_command(None, LEASE_LOST_EXIT_CODE, lease_lost=True)
            return LEASE_LOST_EXIT_CODE
        guard = Guard.start(run_token, base)
        # (Under CONTINUE a lost lease does not stop the command: nor does its deadline.)
        follows = guard is not None and lease is not None and policy is LeaseLossPolicy.TERMINATE
        lag = guard_lag(lease.settings.ttl) if lease is not None and follows else 0.0
        # Started before the command is: its bound can only come early, by the time
        # a spawn takes, never late.
        bound = _Bound.starting(context, lag or GUARD_LAG_MAX)
        if guard is not None and bound is not None:
            # The guard kills the group once the bound and its grace are over,
            # should the wrapper not have stopped it by then (stopped, frozen).
            guard.cap(bound.guard_at)
            if not follows:
                guard.kill_at(math.inf)  # the cap
        if guard is not None and lease is not None and follows:
            guard.follow(lease, lag)
        outputs = (
            OutputTails(context.output_tail_bytes, context.url)
            if context.output_tail_bytes and context.history
            else None
        )
        try:
            child = await Child.start(
                list(argv),
                env,
                None if guard is not None else parent_death_signal(),
                None if outputs is None else outputs.child_ends,
            )
        except BaseException:
            if outputs is not None:
                outputs.abandon()
            _dismiss(guard, lease)
            raise
        if outputs is not None:
            outputs.start()
        if guard is not None:
            guard.watch(child.group)
        if route is not None:
            for signum in route.started(child.group):
                _forward(child.group, signum)
        try:
            code, timed_out = await _watch(child, argv, lease, policy, guard, lag, bound)
            await clear_group(child.group)
            lost = lease is not None and lease.is_lost()
            end = end_of_command(child.returncode, code, lease_lost=lost, timed_out=timed_out)
            if outputs is not None:
                # Its group is gone: the pipes end once the copying has caught up.
                # Kept whatever the outcome: the run's record drops them for a
                # success, and a success whose lease went as it ended is no success.
                stdout_tail, stderr_tail = await to_thread(outputs.finish)
                end = end._replace(stdout_tail=stdout_tail, stderr_tail=stderr_tail)
            session.run_end = end
            return code
        except BaseException:
            # Interrupted (KeyboardInterrupt, cancellation): never leave the command
            # running after its locks are released, not even if interrupted again.
            try:
                await stop_group(child)
            finally:
                signal_group(child.group, signal.SIGKILL)
            raise
        finally:
            _dismiss(guard, lease)
    finally:
        if route is not None:
            route.ended()


def _dismiss(guard: Guard | None, lease: LeaseLock | None) -> None:
    """The run is over: the renewer stops telling the guard, and the guard ends."""
    if lease is not None:
        lease.follow_deadline(None)
    if guard is not None:
        guard.stand_down()


def _forward(pgid: int, signum: int) -> None:
    logger.info("forwarding signal %d to process group %d", signum, pgid)
    signal_group(pgid, signum)


def _on_signal(route: SignalRoute, interrupt: Callable[[int], None]) -> Callable[[int], None]:
    """The one handler of a wrapped run's forwarded signals, doing what ``route`` says."""

    def on_signal(signum: int) -> None:
        action = route.arrived(signum)
        if action is SignalAction.INTERRUPT:
            interrupt(signum)
        elif action is SignalAction.FORWARD and route.group is not None:
            _forward(route.group, signum)
        elif action is SignalAction.DROP:
            logger.info("signal %d ignored: the command has ended; releasing its locks", signum)

    return on_signal


class _Bound(NamedTuple):
    """A run's maximum runtime: the lock key it is reported under, the bound, when
    (monotonic) it is over, and how long after its grace the guard kills."""

    lock_key: str
    seconds: float
    stop_at: float
    guard_lag: float

    @classmethod
    def starting(cls, context: LockContext, guard_lag: float) -> _Bound | None:
        """``context``'s bound, counted from now; None without one."""
        seconds = context.max_runtime_seconds
        if seconds is None:
            return None
        return cls(context.lock_key, seconds, monotonic() + seconds, guard_lag)

    @property
    def guard_at(self) -> float:
        """The latest instant the guard may be told: the bound, its grace, the lag."""
        return self.stop_at + KILL_GRACE + self.guard_lag

    def line(self, consequence: str) -> str:
        return max_runtime_line(self.lock_key, self.seconds, consequence)


def _terminating(argv: Sequence[str], child: Child, status: int, grace: float = KILL_GRACE) -> str:
    return f"terminating {argv[0]} (pid {child.pid}, SIGKILL after {grace:.3g} s), exit {status}"


def _guard_killed(argv: Sequence[str], child: Child, status: int) -> str:
    return f"its guard killed the process group of {argv[0]} (pid {child.pid}), exit {status}"


async def _terminate(
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
    await _finish_stop(child, grace, started)


async def _watch(
    child: Child,
    argv: Sequence[str],
    lease: LeaseLock | None,
    policy: LeaseLossPolicy,
    guard: Guard | None,
    lag: float,
    bound: _Bound | None,
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
            if await _guard_killed_at_deadline(guard, patience):
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
                consequence = _guard_killed(argv, child, LEASE_LOST_EXIT_CODE)
                logger.error(
                    "%s", lease_loss_line(lease.context.lock_key, GUARD_FIRED, consequence)
                )
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
                await _terminate(child, guard, lag, line, grace)
                return LEASE_LOST_EXIT_CODE, False
            _report_loss(lease, f"{argv[0]} keeps running (lease loss policy: continue)")
            lease = None  # CONTINUE: stop checking
        if bound is not None and monotonic() >= bound.stop_at:
            line = bound.line(_terminating(argv, child, MAX_RUNTIME_EXIT_CODE))
            await _terminate(child, guard, bound.guard_lag, line)
            return MAX_RUNTIME_EXIT_CODE, True


def _report_loss(lease: LeaseLock, consequence: str) -> None:
    """The one line that says a lease was lost and what happens to the command."""
    logger.error("%s", lease_loss_line(lease.context.lock_key, lease.lost_reason, consequence))


async def run_with_locks(
    command: Sequence[str],
    *,
    context: LockContext,
    strategies: str | Iterable[str] = (SCHEDULE,),
    forward_signals: Iterable[int] = (),
    withheld_variables: Iterable[str] = (),
) -> int:
    """Acquire the locks, run ``command`` and return its exit status.

    Returns the command's exit code (128+n if signal n killed it),
    ``LEASE_LOST_EXIT_CODE`` (75) when the lease was lost under ``TERMINATE`` (or
    taken over, ``LockContext.replace``), or ``MAX_RUNTIME_EXIT_CODE`` (124) when it
    ran past ``LockContext.max_runtime_seconds``.
    Raises ``LockNotAcquiredError`` when another owner holds a lock, without
    running the command, and FileNotFoundError or PermissionError, before taking
    any lock, when the command cannot be run.

    The command's environment also holds ``DISLOCK_LOCK_KEY``, ``DISLOCK_RUN_TOKEN``
    (random, the run's own), ``DISLOCK_ATTEMPT`` (which attempt of its schedule
    slot it is: 1, or more with ``LockContext.retries``) and, with
    ``LockContext.fencing``, ``DISLOCK_FENCING_TOKEN``;
    it inherits ours except ``withheld_variables`` (e.g. the one holding the
    database URL, so that the command cannot use the lock credential).

    ``forward_signals`` (e.g. ``dislock.core.supervision.FORWARDED_SIGNALS``) are
    caught while the command runs and passed on to its process group, so that
    the locks are released only once it has exited; this needs the main thread.
    Before the locks are held (during the jitter, or while waiting for a lock),
    one of them ends the wait at once and 128 + its number is returned; one that
    comes after, before the command has started, is passed on as soon as it has;
    one that comes once it has ended is ignored, so that the release completes.
    """
    argv = check_command(command)
    ensure_runnable(argv[0])  # before locking: a typo must not use up a schedule slot
    route = SignalRoute()
    status: int | None = None
    try:
        async with AsyncExitStack() as stack:
            # One handler for the whole run (see SignalRoute), removed only once
            # the locks are released: no instant in between is left to a signal's
            # default action.
            stack.enter_context(handling_signals(forward_signals, _on_signal(route, interrupter())))
            async with interrupting(route):
                session = await enter_exit_first(stack, acquire_unguarded(context, strategies))
            status = await supervise(
                argv, session, context.lease_loss_policy, route, withheld_variables
            )
    except LeaseLostError as exc:
        if status == LEASE_LOST_EXIT_CODE:
            logger.debug("%s", exc)  # supervise has said so, in one line
        else:  # lost after the command had exited
            logger.error(
                "%s", lease_loss_line(context.lock_key, exc.reason, f"exit {LEASE_LOST_EXIT_CODE}")
            )
        return LEASE_LOST_EXIT_CODE
    except Interrupted as exc:
        logger.info("signal %d before %s started; not running it", exc.signum, argv[0])
        return 128 + exc.signum
    assert status is not None
    return status
