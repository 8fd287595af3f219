"""The guard of a wrapped command: what the wrapper tells it, and the guard itself.

The guard is a process of its own, outside the command's process group and the
wrapper's, that SIGKILLs the command's whole group when the wrapper dies or stalls
past the lease's local deadline (docs/guarantees.md, "A killed or stopped
wrapper").  The wrapper starts it as ``python -I -S`` on this file, with its own
interpreter: dislock is not on its path, and it runs no other program.

The wrapper writes lines to its standard input, a pipe whose only writer is the
wrapper (``group_line``, ``until_line``, ``DONE``): the command's process group;
the instant, on ``time.monotonic()``'s clock (which both share, being one
system-wide clock), at which to kill the group unless told a later one; and that
the run is over.  End of input means the wrapper is gone, however it died.

Importing this module does no I/O: the wrapper imports it for the protocol.  (No
``from __future__ import annotations``: that would be one more module to load.)
"""

import os
import select
import sys
import time

RUN_TOKEN_VARIABLE = "DISLOCK_RUN_TOKEN"
"""A random value of the run's own, in the command's environment: a wrapper that
dies (or stops) before it could name the command's process group to its guard
leaves the guard this to find the command's processes by (``/proc/PID/environ``)."""

GUARD_TOKEN_VARIABLE = "DISLOCK_GUARD_FOR"
"""The run's token as its guard is given it: in its environment, which only its
user can read, rather than in its arguments, which anyone can."""

DEADLINE_EXIT = 3
"""The guard's exit status when it killed the group because its deadline passed."""

DONE = b"done\n"

SIGKILL = 9
"""The same number on every POSIX system (``kill -9``); ``signal`` is not imported."""

_IGNORED = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2")

_SCAN_PASSES = 3
_SCAN_PAUSE = 0.1
_NEVER = float("inf")


def group_line(pgid: int) -> bytes:
    return b"group %d\n" % pgid


def until_line(when: float) -> bytes:
    """Kill the group at ``when`` (monotonic seconds; infinity: never), unless
    a later instant is sent before then."""
    return f"until {when!r}\n".encode()


class Orders:
    """What the guard has been told so far, fed the bytes read from its input.

    The kill instant only ever moves later: the wrapper's renewer and its main
    thread may send theirs in either order."""

    def __init__(self) -> None:
        self.group: int | None = None
        self.kill_at: float | None = None
        self.done = False
        self._partial = b""

    def feed(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            word, _, argument = line.partition(b" ")
            try:
                if word == b"group":
                    self.group = int(argument)
                elif word == b"until":
                    when = float(argument)
                    if when == when:  # not NaN
                        self.kill_at = when if self.kill_at is None else max(self.kill_at, when)
                elif word == b"done":
                    self.done = True
            except ValueError:
                continue  # never from the wrapper; nothing to act on

    def timeout(self, now: float) -> float | None:
        """How long to wait for more input before killing (None: for ever)."""
        if self.kill_at is None or self.kill_at == _NEVER:
            return None
        return max(0.0, self.kill_at - now)


def _kill(target: int) -> None:
    # Not contextlib.suppress: importing contextlib would double the guard's start-up.
    try:  # noqa: SIM105
        os.kill(target, SIGKILL)
    except OSError:  # gone already, or not ours to kill
        pass


def _kill_by_token(token: str) -> None:
    """Kill every process whose environment holds the run's token, and the group
    each leads, three times over 0.2 s (which also finds a command still on its
    way to ``exec``).  The pid's own group is killed rather than the group
    ``/proc/PID/stat`` names, which a process can spoof through its name."""
    if not token:
        return
    wanted = f"{RUN_TOKEN_VARIABLE}={token}".encode()
    for attempt in range(_SCAN_PASSES):
        if attempt:
            time.sleep(_SCAN_PAUSE)
        try:
            entries = os.listdir("/proc")
        except OSError:  # no /proc: nothing to scan
            return
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as environ:
                    variables = environ.read().split(b"\0")
            except OSError:  # gone meanwhile, or another user's
                continue
            if wanted in variables:
                _kill(-int(entry))
                _kill(int(entry))


def _kill_group(orders: Orders, token: str) -> None:
    if orders.group is not None:
        _kill(-orders.group)
    else:  # the wrapper could not say which group: find the command by its token
        _kill_by_token(token)


def main() -> int:
    """Wait for orders until the deadline passes or the input ends, then kill."""
    # The built-in module: ``signal`` would import ``enum`` and more, most of
    # what the guard's start-up would then cost.
    import _signal  # type: ignore[import-not-found]  # no stub; what signal wraps

    for name in _IGNORED:
        # Only the wrapper ends the guard: not an operator's signal meant for the
        # wrapper (the guard leads a session of its own, out of the terminal's reach).
        _signal.signal(getattr(_signal, name), _signal.SIG_IGN)
    token = os.environ.get(GUARD_TOKEN_VARIABLE, "")
    orders = Orders()
    while True:
        # Whatever is already waiting in the pipe is read before the deadline is
        # judged: a guard scheduled late must not kill on an instant already replaced.
        ready, _, _ = select.select([0], [], [], orders.timeout(time.monotonic()))
        if not ready:
            _kill_group(orders, token)
            return DEADLINE_EXIT
        data = os.read(0, 4096)
        if not data:  # the wrapper is gone, by whatever death
            _kill_group(orders, token)
            return 0
        orders.feed(data)
        if orders.done:
            return 0


if __name__ == "__main__":
    sys.exit(main())
