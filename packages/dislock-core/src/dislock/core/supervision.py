"""Decisions of the command wrapper: timings, exit codes, jitter and owner tokens."""

from __future__ import annotations

import os
import random
import signal
import socket
from collections.abc import Mapping, Sequence

from dislock.core.errors import ConfigurationError

KILL_GRACE = 10.0
"""Seconds between SIGTERM and SIGKILL when a command must stop."""

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


LOCK_KEY_VARIABLE = "DISLOCK_LOCK_KEY"
FENCING_TOKEN_VARIABLE = "DISLOCK_FENCING_TOKEN"


def child_environment(
    base: Mapping[str, str], lock_key: str, fencing_token: int | None
) -> dict[str, str]:
    """The wrapped command's environment: ours, plus the lock it runs under and, with
    fencing, the token to pass along with whatever it writes."""
    env = dict(base)
    env[LOCK_KEY_VARIABLE] = lock_key
    if fencing_token is None:
        env.pop(FENCING_TOKEN_VARIABLE, None)  # never a stale token from an outer run
    else:
        env[FENCING_TOKEN_VARIABLE] = str(fencing_token)
    return env


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: its code, or 128+n if signal n killed it."""
    return 128 - returncode if returncode < 0 else returncode


def jitter_delay(max_seconds: float, rng: random.Random | None = None) -> float:
    """A uniform delay in ``[0, max_seconds]``; zero when jitter is off."""
    if max_seconds <= 0:
        return 0.0
    return (rng or random).uniform(0.0, max_seconds)


def default_owner() -> str:
    """``hostname:pid:nonce`` — readable, and unique per run even where containers
    share hostnames and pid 1."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
