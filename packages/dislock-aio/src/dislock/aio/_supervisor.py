"""``run_with_locks``: run a command under locks, as a supervisor.

The command leads a process group (and session) of its own, so that signals, a
lease loss and the stop of what is left of it (``_watching``) reach
all of it; a guard (``dislock.core.guard``) outside the group kills it should the
wrapper die or stall past the lease's deadline, and is told the group as soon as the
command has started.  Why it is built so, and what still escapes it:
docs/guarantees.md, "A killed or stopped wrapper, and processes that escape".
"""

from __future__ import annotations

import logging
import math
import os
import signal
from collections.abc import Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from time import monotonic

from dislock.core.config import SCHEDULE
from dislock.core.context import LEASE_LOST_EXIT_CODE, LeaseLossPolicy, LockContext
from dislock.core.errors import Interrupted, LeaseLostError
from dislock.core.history import RunEnd, end_of_command
from dislock.core.observing import note
from dislock.core.output_tail import OutputTails
from dislock.core.processes import Guard, ensure_runnable, parent_death_signal, signal_group
from dislock.core.slot_context import slot_variables
from dislock.core.supervision import (
    GUARD_LAG_MAX,
    KILL_GRACE,
    SignalAction,
    SignalRoute,
    check_command,
    child_environment,
    guard_lag,
    inherited_environment,
    lease_loss_line,
    new_run_token,
)

from ._compat import Child, handling_signals, interrupter, interrupting, to_thread
from ._lease import LeaseLock
from ._session import LockSession, acquire_unguarded, enter_exit_first
from ._watching import Bound, clear_group, report_loss, stop_group, watch

logger = logging.getLogger("dislock")


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
    slot = slot_variables(session.slot_start, session.slot_end, session.last_success)
    env = child_environment(
        base,
        context.lock_key,
        session.fencing_token,
        run_token,
        attempt=session.attempt,
        slot=slot,
    )
    lease = session.lease
    try:
        if lease is not None and lease.declare_if_lost():
            # Lost before the command could even start.
            report_loss(lease, f"not starting {argv[0]}, exit {LEASE_LOST_EXIT_CODE}")
            session.run_end = end_of_command(None, LEASE_LOST_EXIT_CODE, lease_lost=True)
            return LEASE_LOST_EXIT_CODE
        guard = Guard.start(run_token, base)
        lag, bound = _bind_guard(guard, context, lease, policy)
        outputs: OutputTails | None = None
        if context.output_tail_bytes and context.history:
            outputs = OutputTails(context.output_tail_bytes, context.url)
        try:
            child = await _start(argv, env, guard, outputs)
            note("started", attempt=session.attempt, fencing_token=session.fencing_token)
            if route is not None:
                for signum in route.started(child.group):
                    _forward(child.group, signum)
            try:
                code, timed_out = await watch(child, argv, lease, policy, guard, lag, bound)
                session.run_end = await _end_of_run(child, code, timed_out, lease, outputs)
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


def _bind_guard(
    guard: Guard | None, context: LockContext, lease: LeaseLock | None, policy: LeaseLossPolicy
) -> tuple[float, Bound | None]:
    """Tell the guard when to kill the group should the wrapper not stop it: after
    the lease's deadline under ``TERMINATE`` and after the maximum runtime.  The
    guard's lag past those instants, and the runtime's bound."""
    # (Under CONTINUE a lost lease does not stop the command: nor does its deadline.)
    follows = guard is not None and lease is not None and policy is LeaseLossPolicy.TERMINATE
    lag = guard_lag(lease.settings.ttl) if lease is not None and follows else 0.0
    # Started before the command is: its bound can only come early, by the time
    # a spawn takes, never late.
    bound: Bound | None = None
    seconds = context.max_runtime_seconds
    if seconds is not None:
        bound = Bound(context.lock_key, seconds, monotonic() + seconds, lag or GUARD_LAG_MAX)
    if guard is not None and bound is not None:
        # The guard kills the group once the bound and its grace are over,
        # should the wrapper not have stopped it by then (stopped, frozen).
        guard.cap(bound.stop_at + KILL_GRACE + bound.guard_lag)
        if not follows:
            guard.kill_at(math.inf)  # the cap
    if guard is not None and lease is not None and follows:
        guard.follow(lease, lag)
    return lag, bound


async def _start(
    argv: Sequence[str], env: dict[str, str], guard: Guard | None, outputs: OutputTails | None
) -> Child:
    """The command started in a process group of its own, its output copied and the
    guard told its group."""
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
        raise
    if outputs is not None:
        outputs.start()
    if guard is not None:
        guard.watch(child.group)
    return child


async def _end_of_run(
    child: Child, code: int, timed_out: bool, lease: LeaseLock | None, outputs: OutputTails | None
) -> RunEnd:
    """Once the command exited: what is left of its group stopped, and the run's end
    for its record."""
    await clear_group(child.group)
    lost = lease is not None and lease.is_lost()
    end = end_of_command(child.returncode, code, lease_lost=lost, timed_out=timed_out)
    if outputs is not None:
        # Its group is gone: the pipes end once the copying has caught up.
        # Kept whatever the outcome: the run's record drops them for a
        # success, and a success whose lease went as it ended is no success.
        stdout_tail, stderr_tail = await to_thread(outputs.finish)
        end = end._replace(stdout_tail=stdout_tail, stderr_tail=stderr_tail)
    return end


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
    slot it is: 1, or more with ``LockContext.retries``), ``DISLOCK_SLOT_START``,
    ``DISLOCK_SLOT_END`` and ``DISLOCK_LAST_SUCCESS`` (``dislock.core.slot_context``;
    unset when not known) and, with
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
            line = lease_loss_line(context.lock_key, exc.reason, f"exit {LEASE_LOST_EXIT_CODE}")
            note("lease_lost", reason=exc.reason)
            logger.error("%s", line)
        return LEASE_LOST_EXIT_CODE
    except Interrupted as exc:
        logger.info("signal %d before %s started; not running it", exc.signum, argv[0])
        return 128 + exc.signum
    assert status is not None
    return status
