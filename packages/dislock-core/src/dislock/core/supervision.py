"""Decisions of the command wrapper: its command, signals, timings and exit codes."""

from __future__ import annotations

import enum
import os
import signal
from collections.abc import Iterable, Mapping, Sequence

from dislock.core.errors import ConfigurationError
from dislock.core.guard import GUARD_TOKEN_VARIABLE, RUN_TOKEN_VARIABLE
from dislock.core.lease_clock import safety_margin

KILL_GRACE = 10.0
"""Seconds between SIGTERM and SIGKILL when a command must stop."""

GUARD_LAG_MAX = 0.25
"""The longest the guard waits past the lease's local deadline before it kills."""


def guard_lag(ttl: float) -> float:
    """How long after the lease's local deadline its guard kills the command's group:
    long enough that a wrapper able to act stops the command itself; at most half
    the safety margin, so that the group is dead before the row can expire."""
    return min(GUARD_LAG_MAX, safety_margin(ttl) / 2)


FORWARDED_SIGNALS: tuple[signal.Signals, ...] = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
"""Signals the CLI passes on to the command's process group."""


def check_command(command: Sequence[str]) -> list[str]:
    if isinstance(command, str) or not isinstance(command, Sequence):
        raise ConfigurationError(f"command must be a list of arguments, got {command!r}")
    argv = list(command)
    if not argv:
        raise ConfigurationError("no command given to run")
    for arg in argv:
        if not isinstance(arg, (str, bytes, os.PathLike)):
            raise ConfigurationError(f"command arguments must be strings, got {arg!r}")
    return [os.fsdecode(arg) for arg in argv]


class SignalAction(enum.Enum):
    """What a forwarded signal does at the moment it arrives (``SignalRoute``)."""

    INTERRUPT = "interrupt"  # the locks are being taken: nothing runs yet
    KEEP = "keep"  # until the command's process group exists
    FORWARD = "forward"  # to the command's process group
    DROP = "drop"  # the command has ended: the release must complete


class SignalRoute:
    """Where a forwarded signal goes, for the whole of a wrapped run: what it does
    follows the run's phase (``SignalAction``), under one handler installed from
    before the locks are taken until they are released (changed between phases, a
    signal arriving in between would end the wrapper while it held a lock)."""

    __slots__ = ("_held", "_phase", "fired", "group")

    def __init__(self) -> None:
        self._phase = SignalAction.INTERRUPT
        self._held: list[int] = []
        self.fired: int | None = None  # the signal that interrupted the wait, if one did
        self.group: int | None = None  # the command's process group while it runs

    def arrived(self, signum: int) -> SignalAction:
        """What ``signum``, arriving now, does (a kept signal is remembered)."""
        phase = self._phase
        if phase is SignalAction.INTERRUPT:
            if self.fired is not None:
                return SignalAction.DROP  # the wait is already ending
            self.fired = signum
        elif phase is SignalAction.KEEP:
            self._held.append(signum)
        return phase

    def locks_held(self) -> None:
        """The wait for the locks is over: signals are kept for the command."""
        if self._phase is SignalAction.INTERRUPT:
            self._phase = SignalAction.KEEP

    def started(self, pgid: int) -> list[int]:
        """The command runs as group ``pgid``: the signals kept so far, to pass on."""
        self.group = pgid
        self._phase = SignalAction.FORWARD
        held, self._held = self._held, []
        return held

    def ended(self) -> None:
        """The command has ended (or never started): signals are dropped."""
        self._phase = SignalAction.DROP
        self.group = None
        self._held.clear()


LOCK_KEY_VARIABLE = "DISLOCK_LOCK_KEY"
FENCING_TOKEN_VARIABLE = "DISLOCK_FENCING_TOKEN"
ATTEMPT_VARIABLE = "DISLOCK_ATTEMPT"
PGOPTIONS_VARIABLE = "PGOPTIONS"


def new_run_token() -> str:
    return os.urandom(8).hex()


def inherited_environment(base: Mapping[str, str], withheld: Iterable[str]) -> dict[str, str]:
    """What the command and its guard start from: ``base`` without the ``withheld``
    variables (the wrapper's ``LOCK_PASS_URL=0`` withholds the database URL's)."""
    hidden = frozenset(withheld)
    return {name: value for name, value in base.items() if name not in hidden}


def child_environment(
    base: Mapping[str, str],
    lock_key: str,
    fencing_token: int | None,
    run_token: str,
    *,
    attempt: int = 1,
    slot: Mapping[str, str | None] | None = None,
) -> dict[str, str]:
    """The wrapped command's environment: ours, plus the lock it runs under, the
    run's token, its attempt in the slot, ``slot``'s variables
    (``dislock.core.slot_context``; None: unset) and, with fencing, the token."""
    env = dict(base)
    for name, value in (slot or {}).items():
        if value is None:
            env.pop(name, None)  # never an outer run's
        else:
            env[name] = value
    env[LOCK_KEY_VARIABLE] = lock_key
    env[RUN_TOKEN_VARIABLE] = run_token
    env[ATTEMPT_VARIABLE] = str(attempt)
    if fencing_token is None:
        env.pop(FENCING_TOKEN_VARIABLE, None)  # never a stale token from an outer run
    else:
        env[FENCING_TOKEN_VARIABLE] = str(fencing_token)
    if fencing_token is not None or "fencing_token" in env.get(PGOPTIONS_VARIABLE, ""):
        # libpq clients the command starts carry the token to a fenced table by
        # themselves (dislockctl fence).  Imported here: most runs are not fenced.
        from dislock.core.fencing import pgoptions

        options = pgoptions(env.get(PGOPTIONS_VARIABLE), fencing_token)
        if options is None:
            env.pop(PGOPTIONS_VARIABLE, None)
        else:
            env[PGOPTIONS_VARIABLE] = options
    return env


def guard_environment(base: Mapping[str, str], run_token: str) -> dict[str, str]:
    """The guard's environment: the run's token under the guard's own name, and no
    outer run's token (the guard is not part of an outer dislock run's command)."""
    env = {name: value for name, value in base.items() if name != RUN_TOKEN_VARIABLE}
    env[GUARD_TOKEN_VARIABLE] = run_token
    return env


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: its code, or 128+n if signal n killed it."""
    return 128 - returncode if returncode < 0 else returncode


def runs_in_group(stat: bytes, pgid: int) -> bool:
    """Whether a Linux ``/proc/PID/stat`` line is that of a process of group
    ``pgid`` that still runs (not a zombie, which ``kill(-pgid, 0)`` still finds)."""
    # The command name (field 2) is in parentheses and may hold anything, spaces
    # and parentheses included: the fields that follow are read after the last ")".
    fields = stat[stat.rfind(b")") + 1 :].split()
    if len(fields) < 3 or not fields[2].isdigit():
        return False
    return int(fields[2]) == pgid and fields[0] not in (b"Z", b"X", b"x")


LOSS_LOGGER = "dislock.lease"
"""The logger of the locks' own notes on a lost lease (the wrapper says it in one
line of its own, ``lease_loss_line``, and shows these only at ``DEBUG``)."""


GUARD_FIRED = "its local deadline passed while the wrapper was stopped or stalled"
"""Why a lease counts as lost when the command's guard killed its group: the
wrapper let the deadline pass without acting (``SIGSTOP``, a debugger, a write
blocked on a full pipe, a machine too loaded to run it)."""


def loss_grace(replacing: bool, until_deadline: float | None) -> float:
    """Seconds between the ``SIGTERM`` and the ``SIGKILL`` of a command whose lease was
    lost: ``KILL_GRACE``, but only until the lease's local deadline when a replacer
    marked the row: whoever takes it next must find the command gone."""
    if not replacing or until_deadline is None:
        return KILL_GRACE
    return max(0.0, min(KILL_GRACE, until_deadline))


def lease_loss_line(lock_key: str, reason: str | None, consequence: str) -> str:
    """What the wrapper says when a lease is lost: one line, for the operator."""
    return f"lease lost for lock {lock_key!r}: {reason or 'unknown reason'}; {consequence}"


def max_runtime_line(lock_key: str, seconds: float, consequence: str) -> str:
    """What the wrapper says when a command ran past its bound: one line, naming it."""
    bound = f"the command ran past its maximum runtime of {seconds:g} s"
    return f"lock {lock_key!r}: {bound}; {consequence}"
