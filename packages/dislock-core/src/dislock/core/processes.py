"""The wrapper's process plumbing that has no flavour: its handle on the command's
guard (``dislock.core.guard``), and the checks and signals of the command's process
group.  Nothing here waits; unlike the rest of ``dislock.core`` it starts and
signals processes.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Protocol

from dislock.core import guard as guard_program
from dislock.core.guard import DEADLINE_EXIT, DONE, group_line, until_line
from dislock.core.observing import note
from dislock.core.supervision import guard_environment, runs_in_group


class Deadlined(Protocol):
    """A held lease as its guard follows it (``LeaseLock``, either flavour)."""

    @property
    def deadline(self) -> float | None: ...

    def follow_deadline(self, follower: Callable[[float], None] | None) -> None: ...


_PR_SET_PDEATHSIG = 1


def parent_death_signal() -> Callable[[], None] | None:
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


def _guard_argv() -> list[str] | None:
    """How to start a guard: this interpreter, isolated and without ``site``, on the
    guard's module file; None where either is not a file (a frozen application)."""
    program, python = guard_program.__file__, sys.executable
    runnable = python and os.path.isabs(python) and os.access(python, os.X_OK)
    if not (runnable and program and os.path.isfile(program)):
        return None
    return [python, "-I", "-S", program, "dislock-guard"]


class Guard:
    """Kills a process group when this process dies, by any means, or lets the
    lease's deadline pass (either flavour's ``_supervisor`` says how)."""

    def __init__(self, process: subprocess.Popen[bytes], pipe: int) -> None:
        self._process = process
        self._pipe = pipe
        # The renewer's thread writes deadlines while the main thread may stand the
        # guard down: a closed descriptor's number must never be written to.
        self._lock = threading.Lock()
        # No instant later than this is ever sent (``cap``): the guard only ever
        # moves its instant later, so a bound must be kept on this side.
        self._cap = math.inf

    @classmethod
    def start(cls, run_token: str, base: Mapping[str, str] | None = None) -> Guard | None:
        """A guard of the command whose environment holds ``run_token``, or None
        where none can be started."""
        if sys.platform == "win32":
            return None
        argv = _guard_argv()
        if argv is None:
            return None
        _reap_guards()
        read, write = os.pipe()  # not inherited by anything but the guard's stdin
        try:
            process = subprocess.Popen(
                argv,
                stdin=read,
                env=guard_environment(os.environ if base is None else base, run_token),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # outside both the wrapper's and the command's group
            )
        except BaseException as exc:
            os.close(write)
            if isinstance(exc, OSError):
                return None
            raise
        finally:
            os.close(read)
        # A guard that stopped reading (stopped itself) must not block the renewer:
        # what cannot be written now is dropped.
        os.set_blocking(write, False)
        return cls(process, write)

    def _send(self, line: bytes) -> None:
        with self._lock:
            if self._pipe < 0:
                return
            with contextlib.suppress(OSError):  # a guard killed by someone else
                os.write(self._pipe, line)

    def watch(self, pgid: int) -> None:
        self._send(group_line(pgid))

    def kill_at(self, when: float) -> None:
        """Kill the group at ``when`` (monotonic; ``math.inf``: never) unless told a
        later instant (an earlier one changes nothing); never later than the ``cap``."""
        self._send(until_line(min(when, self._cap)))

    def cap(self, when: float) -> None:
        """Never kill the group later than ``when`` (a run's maximum runtime and its
        grace); set before the first instant: the guard never moves one earlier."""
        self._cap = when

    def follow(self, lease: Deadlined, lag: float) -> None:
        """Kill the group ``lag`` seconds after the lease's local deadline, told
        the new one after each renewal."""

        def renewed(deadline: float) -> None:
            self.kill_at(deadline + lag)

        lease.follow_deadline(renewed)
        deadline = lease.deadline  # read after: no renewal's deadline is missed
        if deadline is not None:
            renewed(deadline)

    def verdict(self) -> bool | None:
        """Whether the guard killed the group because the deadline passed; None
        while it runs (it exits right after killing)."""
        code = self._process.poll()
        return None if code is None else code == DEADLINE_EXIT

    def stand_down(self) -> None:
        with self._lock:
            pipe, self._pipe = self._pipe, -1
            if pipe < 0:
                return
            with contextlib.suppress(OSError):  # a guard killed by someone else
                os.write(pipe, DONE)
            os.close(pipe)
        # Not waited for: on a busy machine the guard may not even have started
        # yet, and the wrapper's exit must not queue behind it.  It exits as soon
        # as it reads "done", and is reaped later (or by init once we are gone).
        _reap_guards()
        if self._process.poll() is None:
            _guards_to_reap.append(self._process)


_guards_to_reap: list[subprocess.Popen[bytes]] = []


def _reap_guards() -> None:
    _guards_to_reap[:] = [process for process in _guards_to_reap if process.poll() is None]


@atexit.register
def _let_guards_go() -> None:
    """At exit, drop the guards still on their way out without waiting (init reaps
    them), and without the warning a Popen freed while its process runs gives."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        _reap_guards()
        _guards_to_reap.clear()


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
        note("kill", signal=signal.Signals(signum).name, process_group=pgid)


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is left, once its leader has been reaped
    (this reaps members that became our children, where we are pid 1)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-pgid, os.WNOHANG)[0]:
            pass
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a member we may not signal (setuid): still running
    # kill() also finds zombies.  A member whose parent died (sh killed while its
    # ``sleep`` ran) is reparented to init, and some inits reap only every second
    # or so: counted as alive, that zombie would hold up the stop by as long.
    return _group_runs(pgid)


def _group_runs(pgid: int) -> bool:
    """Whether a process of the group that is not a zombie is left, as ``/proc``
    tells on Linux; elsewhere, presumed so."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                line = stat.read()
        except OSError:  # gone meanwhile
            continue
        if runs_in_group(line, pgid):
            return True
    return False


_OWNER = re.compile(r"(?P<host>.+):(?P<pid>[0-9]{1,10}):[0-9a-f]{8}(?: \(|$)")
"""An owner token as ``LockContext``'s default makes it (``host:pid:nonce``), maybe
followed by a mark of dislock's (`` (attempt 2)``)."""


def gone_here(owner: str) -> int | None:
    """The pid of ``owner``'s process if the token names this host and no process
    of that pid runs here (the wrapper was killed); None otherwise (a pid reused
    since reads as running: never a holder said gone that is not)."""
    import socket

    found = _OWNER.match(owner)
    if found is None or found["host"] != socket.gethostname():
        return None
    pid = int(found["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return pid
    except (PermissionError, OverflowError):
        return None
    return None
