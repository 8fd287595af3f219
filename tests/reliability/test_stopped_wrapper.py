"""A wrapper that stops without dying cannot keep its command past the lease's deadline.

The wrapper is frozen two ways while its command runs: ``SIGSTOP``, and a write
blocked on a full stderr pipe (its renewer warning that a renewal failed, the row
being held ``FOR UPDATE`` by the test meanwhile).  Either way its renewer stops, and
only the guard, outside the wrapper, can stop the command: its whole group must be
dead at most 0.5 s after the lease's local deadline.  A contender started once the
TTL has passed then runs its own command, which must not overlap the first one,
judged from the timestamps each command writes itself.  The frozen wrapper, let go,
exits 75 with one line.  Each case runs through the CLI, and through
``run_with_locks`` of the sync and asyncio APIs (``tests.support.stoppable``).

The deadline comes at most ``TTL - margin`` after the last renewal that succeeded,
which was sent before the freeze: the bounds below count from the freeze, which
only makes them stricter.  What the test observes itself (when it sees the group
gone) is allowed a second more, for a loaded machine's scheduling.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from dislock.core.lease_clock import safety_margin
from dislock.core.rows import lease_key
from tests.cli.conftest import DISLOCK
from tests.support.eventually import eventually

TTL = 3.0
INTERVAL = 0.3
DEADLINE = TTL - safety_margin(TTL)
"""The lease's local deadline, counted from the last renewal sent."""
BOUND = 0.5
"""The issue's bound: the group dead at most this long after the deadline."""
OBSERVING = 1.0
"""What the test's own observation of the group's end may add on a loaded machine."""

BEAT = """\
import os, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
with open(path, "a") as out:
    out.write(f"pid {os.getpid()}\\n")
    ends = time.monotonic() + seconds
    while True:
        out.write(f"{time.time()!r}\\n")
        out.flush()
        if time.monotonic() >= ends:
            break
        time.sleep(0.02)
"""
"""A command that says it is alive every 20 ms (wall clock), for ``seconds``."""


class Beats:
    """What a ``BEAT`` command wrote: its pid, and when it was last seen running."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _lines(self) -> list[str]:
        try:
            return self.path.read_text().splitlines()
        except FileNotFoundError:
            return []

    def times(self) -> list[float]:
        return [float(line) for line in self._lines()[1:] if line.strip()]

    @property
    def pid(self) -> int:
        return int(self._lines()[0].split()[1])

    def wait_running(self, beats: int = 3, timeout: float = 30.0) -> None:
        eventually(
            lambda: len(self.times()) >= beats,
            timeout=timeout,
            message=f"{self.path}: the command did not start",
        )


def state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def wait_dead(pid: int, timeout: float) -> float:
    """The monotonic instant at which ``pid`` was seen dead (a zombie counts)."""
    eventually(
        lambda: state(pid) in (None, "Z", "X"),
        timeout=timeout,
        interval=0.01,
        message=f"pid {pid} still runs",
    )
    return time.monotonic()


def beat_command(path: Path, seconds: float) -> list[str]:
    return [sys.executable, "-I", "-S", "-c", BEAT, str(path), str(seconds)]


@pytest.fixture
def key() -> str:
    return f"job-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def env(database_url: str, lock_table: tuple[str, str], key: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LOCK_", "CRON"))}
    return {
        **base,
        "DATABASE_URL": database_url,
        "LOCK_TABLE": ".".join(lock_table),
        "LOCK_KEY": key,
        "LOCK_STRATEGY": "lease",
        "RUN_LOCK_TTL_SECONDS": f"{TTL:g}",
        "LOCK_LEASE_INTERVAL": f"{INTERVAL:g}",
    }


_started: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _no_wrapper_outlives_its_test() -> Iterator[None]:
    yield
    while _started:
        process = _started.pop()
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
        process.wait(timeout=30)


def start_wrapper(
    flavour: str, env: dict[str, str], command: list[str], stderr: int
) -> subprocess.Popen[bytes]:
    if flavour == "cli":
        argv = [*DISLOCK, "DATABASE_URL", *command]
    else:
        schema = env["LOCK_TABLE"].split(".")[0]
        argv = [
            sys.executable,
            "-m",
            "tests.support.stoppable",
            flavour,
            env["DATABASE_URL"],
            schema,
            env["LOCK_KEY"],
            env["RUN_LOCK_TTL_SECONDS"],
            env["LOCK_LEASE_INTERVAL"],
            *command,
        ]
    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(argv, env=env, stderr=stderr, cwd=root)
    _started.append(process)
    return process


def run_contender(env: dict[str, str], beats: Path) -> subprocess.CompletedProcess[str]:
    """Another machine's wrapper, started once the TTL has passed: it waits for the
    row to expire on the server (it may still be live for the milliseconds the last
    renewal took to arrive) and runs a short command."""
    return subprocess.run(
        [*DISLOCK, "DATABASE_URL", *beat_command(beats, 0.3)],
        env={**env, "LOCK_WAIT_SECONDS": "10"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def sleep_until(instant: float) -> None:
    """The contender must start after the TTL: a wait for time itself, not for an event."""
    time.sleep(max(0.0, instant - time.monotonic()))


def assert_bounded(first: Beats, frozen_wall: float, frozen: float, dead: float) -> None:
    beats = first.times()
    last = beats[-1]
    print(
        f"deadline at most {DEADLINE:.2f} s after the freeze; the command's last beat"
        f" {last - frozen_wall:.3f} s after it, seen dead after {dead - frozen:.3f} s"
    )
    # The command's own record: nothing ran past the deadline's bound.
    assert last <= frozen_wall + DEADLINE + BOUND
    # Nor was it killed while the lease was still good (its last renewal came at
    # most a heartbeat before the freeze; half the deadline leaves room for load).
    assert last >= frozen_wall + DEADLINE / 2
    assert dead - frozen <= DEADLINE + BOUND + OBSERVING


def assert_no_overlap(
    first: Beats, second: Beats, contender: subprocess.CompletedProcess[str]
) -> None:
    assert contender.returncode == 0, contender.stderr
    theirs = second.times()
    assert theirs, f"the contender did not run its command: {contender.stderr}"
    assert theirs[0] > first.times()[-1], "the two commands overlapped"


def stderr_lines(data: bytes) -> list[str]:
    return data.decode(errors="replace").lstrip("#").splitlines()


@pytest.mark.parametrize("flavour", ["cli", "sync", "aio"])
def test_a_stopped_wrapper_does_not_keep_its_command_past_the_deadline(
    flavour: str, env: dict[str, str], tmp_path: Path
) -> None:
    first, second = Beats(tmp_path / "first"), Beats(tmp_path / "second")
    wrapper = start_wrapper(flavour, env, beat_command(first.path, 600), subprocess.PIPE)
    first.wait_running()
    time.sleep(INTERVAL * 2)  # a renewal or two: the guard follows them
    frozen_wall = time.time()
    frozen = time.monotonic()
    wrapper.send_signal(signal.SIGSTOP)
    dead = wait_dead(first.pid, TTL + 10)
    sleep_until(frozen + TTL)
    contender = run_contender(env, second.path)
    wrapper.send_signal(signal.SIGCONT)
    _, stderr = wrapper.communicate(timeout=60)

    assert_bounded(first, frozen_wall, frozen, dead)
    assert_no_overlap(first, second, contender)
    assert wrapper.returncode == 75, stderr
    lines = stderr_lines(stderr)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"dislock: lease lost for lock {env['LOCK_KEY']!r}: ")
    assert "deadline passed while the wrapper was stopped" in lines[0]
    assert "exit 75" in lines[0]


def blocked_writing(pid: int) -> bool:
    """Whether a thread of ``pid`` is blocked writing to a pipe."""
    with contextlib.suppress(FileNotFoundError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError):
                if "pipe_write" in Path(f"/proc/{pid}/task/{task}/wchan").read_text():
                    return True
    return False


def full_pipe() -> tuple[int, int]:
    """A pipe already full: the next write to it blocks until someone reads."""
    read, write = os.pipe()
    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 4096)
    # Filled through a description of its own, so that the wrapper's stays blocking.
    filler = os.open(f"/proc/self/fd/{write}", os.O_WRONLY | os.O_NONBLOCK)
    try:
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(filler, b"#" * 512)
    finally:
        os.close(filler)
    return read, write


def drain(read: int, process: subprocess.Popen[bytes], timeout: float) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while chunk := os.read(read, 65536):
        data += chunk
        assert time.monotonic() < deadline, "the wrapper did not exit once its stderr drained"
    process.wait(timeout=max(1.0, deadline - time.monotonic()))
    return data


@pytest.mark.parametrize("flavour", ["cli", "sync", "aio"])
def test_a_wrapper_blocked_on_a_full_stderr_does_not_keep_its_command_past_the_deadline(
    flavour: str, env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    first, second = Beats(tmp_path / "first"), Beats(tmp_path / "second")
    read, write = full_pipe()
    try:
        wrapper = start_wrapper(flavour, env, beat_command(first.path, 600), write)
    finally:
        os.close(write)
    try:
        first.wait_running()
        time.sleep(INTERVAL * 2)
        schema = env["LOCK_TABLE"].split(".")[0]
        row_lock = sql.SQL("SELECT 1 FROM {} WHERE key = %s FOR UPDATE").format(
            sql.Identifier(schema, "key_value")
        )
        with psycopg.connect(database_url) as holder:
            # The next renewal waits for the row, is cancelled, and its warning
            # blocks on the full pipe: the renewer is stuck there for good.
            holder.execute(row_lock, (lease_key(env["LOCK_KEY"]),))
            frozen_wall, frozen = time.time(), time.monotonic()
            deadline = frozen + 30
            while not blocked_writing(wrapper.pid):
                assert time.monotonic() < deadline, "the wrapper never wrote to stderr"
                time.sleep(0.02)
            holder.rollback()
        dead = wait_dead(first.pid, TTL + 10)
        sleep_until(frozen + TTL)
        contender = run_contender(env, second.path)
        stderr = drain(read, wrapper, timeout=60)
    finally:
        os.close(read)

    assert_bounded(first, frozen_wall, frozen, dead)
    assert_no_overlap(first, second, contender)
    assert wrapper.returncode == 75, stderr
    lines = stderr_lines(stderr)
    # The warning that blocked, then the loss, in one line.
    assert len(lines) == 2, lines
    assert lines[0].startswith("dislock: renewal of lease "), lines
    assert lines[1].startswith(f"dislock: lease lost for lock {env['LOCK_KEY']!r}: "), lines
    assert lines[1].endswith("exit 75"), lines


def test_a_wrapper_that_keeps_renewing_keeps_its_command(
    env: dict[str, str], tmp_path: Path
) -> None:
    """The guard follows the renewals: a command running for three TTLs is never
    killed while they succeed."""
    beats = Beats(tmp_path / "beats")
    wrapper = start_wrapper("cli", env, beat_command(beats.path, 3 * TTL), subprocess.PIPE)
    _, stderr = wrapper.communicate(timeout=60)
    assert wrapper.returncode == 0, stderr
    assert stderr == b""
    times = beats.times()
    assert times[-1] - times[0] >= 3 * TTL


def test_a_run_inside_a_stopped_run_is_killed_by_the_outer_deadline(
    env: dict[str, str], tmp_path: Path
) -> None:
    """``dislock`` running ``dislock`` (another lock, a long TTL): the outer wrapper
    stopped, its guard kills the outer group, the inner wrapper with it, and the inner
    guard, seeing its wrapper die, the inner command."""
    beats = Beats(tmp_path / "inner")
    inner = [
        "env",
        f"LOCK_KEY={env['LOCK_KEY']}-inner",
        "RUN_LOCK_TTL_SECONDS=60",
        "LOCK_LEASE_INTERVAL=5",
        *DISLOCK,
        "DATABASE_URL",
        *beat_command(beats.path, 600),
    ]
    outer = start_wrapper("cli", env, inner, subprocess.PIPE)
    beats.wait_running()
    time.sleep(INTERVAL * 2)
    frozen_wall, frozen = time.time(), time.monotonic()
    outer.send_signal(signal.SIGSTOP)
    dead = wait_dead(beats.pid, TTL + 10)
    outer.send_signal(signal.SIGCONT)
    _, stderr = outer.communicate(timeout=60)
    assert_bounded(beats, frozen_wall, frozen, dead)
    assert outer.returncode == 75, stderr
    lines = stderr_lines(stderr)
    assert len(lines) == 1, lines
    assert "deadline passed while the wrapper was stopped" in lines[0]
