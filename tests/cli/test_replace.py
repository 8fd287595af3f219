"""``LOCK_REPLACE=1``: the newest wrapper takes the lease over from a running one, never
overlapping it, measured from each command's own start and end: a live holder (20
times over), a frozen one, a dead one, and a third wrapper waiting for the lease."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.cli.conftest import (
    DISLOCK,
    RunCli,
    assert_refused_in_one_line,
    dislock_on_path,
    run_pasted,
)
from tests.support.eventually import eventually
from tests.support.processes import alive

# The command: it logs its start and, on SIGTERM, its end (with $IGNORE_TERM, only
# that it got it), on the monotonic clock (one clock for every process of the
# machine), with its wrapper's pid; and as it starts, whether the command of
# $WATCH_PID (another wrapper's) is still alive.
COMMAND = """
import os, signal, sys, time
log = sys.argv[1]
def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
def note(what, other=0):
    with open(log, "a") as f:
        f.write(f"{what} {os.getppid()} {time.monotonic_ns()} {os.getpid()} {other}\\n")
def end(*_):
    if os.environ.get("IGNORE_TERM"):
        note("term")  # and carries on: only SIGKILL ends it
        return
    note("end")
    os._exit(143)
signal.signal(signal.SIGTERM, end)
watched = os.environ.get("WATCH_PID")
note("start", int(bool(watched) and alive(int(watched))))
time.sleep(600)
"""


class Event(NamedTuple):
    what: str
    wrapper: int
    at: int
    pid: int
    overlap: bool
    """At a start: whether the watched command was still alive."""


def events(log: Path) -> list[Event]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [Event(w, int(p), int(t), int(c), o == "1") for w, p, t, c, o in map(str.split, lines)]


def starts(log: Path) -> list[Event]:
    return [e for e in events(log) if e.what == "start"]


@pytest.fixture
def replace_env(cli_env: dict[str, str]) -> dict[str, str]:
    # A short lease, renewed often: a replaced holder notices within 0.3 s.
    return {
        **cli_env,
        "LOCK_STRATEGY": "lease",
        "RUN_LOCK_TTL_SECONDS": "3",
        "LOCK_LEASE_INTERVAL": "0.3",
        "LOCK_REPLACE": "1",
    }


class Wrappers:
    """The wrappers a test starts, each running ``COMMAND`` in a session of its own."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.started: list[subprocess.Popen[str]] = []

    def start(self, watch: Event | None = None, **extra: str) -> subprocess.Popen[str]:
        if watch is not None:
            extra["WATCH_PID"] = str(watch.pid)
        wrapper = subprocess.Popen(
            [*DISLOCK, "DATABASE_URL", sys.executable, "-c", COMMAND, str(self.log)],
            env={**self.env, **extra},
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.started.append(wrapper)
        return wrapper

    def running(self, wrapper: subprocess.Popen[str]) -> Event:
        """``wrapper``'s command, once it has started."""
        found = eventually(
            lambda: [e for e in starts(self.log) if e.wrapper == wrapper.pid],
            timeout=60,
            message=f"the command of wrapper {wrapper.pid} never started",
        )
        return found[0]

    def cleanup(self) -> None:
        for wrapper in self.started:
            if wrapper.poll() is None:
                os.killpg(wrapper.pid, signal.SIGCONT)
                os.killpg(wrapper.pid, signal.SIGKILL)
            wrapper.communicate(timeout=30)


@pytest.fixture
def wrappers(replace_env: dict[str, str], tmp_path: Path) -> Iterator[Wrappers]:
    started = Wrappers(replace_env, tmp_path / "log")
    try:
        yield started
    finally:
        started.cleanup()


def assert_one_at_a_time(log: Path) -> None:
    """No command started before one that logged its end had ended, nor while the
    command it watched ran (one SIGKILLed logs no end: the watch tells)."""
    ordered = sorted(events(log), key=lambda e: e.at)
    ends = {e.pid for e in ordered if e.what == "end"}
    running: set[int] = set()
    for event in ordered:
        if event.what == "start":
            assert not running and not event.overlap, (event, ordered)
            if event.pid in ends:
                running.add(event.pid)
        elif event.what == "end":
            running.discard(event.pid)


def owner_of(wrapper: subprocess.Popen[str]) -> str:
    """The start of the owner token the wrapper makes (``host:pid:nonce``)."""
    return f"{socket.gethostname()}:{wrapper.pid}:"


def test_the_docs_block_runs_as_pasted(cli_env: dict[str, str], tmp_path: Path) -> None:
    env = {**cli_env, "PATH": dislock_on_path(tmp_path)}
    result = run_pasted("cli.md", "### Replacing the running copy", env, timeout=120)
    assert result.stdout == "first run started\nthe newest run\nfirst run: exit 75\n", (
        result.stdout,
        result.stderr,
    )
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        f"dislock: lease lost for lock 'report-builder': replaced by {socket.gethostname()}:"
    ), line
    assert "; terminating sh (pid " in line and line.endswith(" s), exit 75"), line


def test_twenty_replacements_never_overlap(wrappers: Wrappers) -> None:
    holder = wrappers.start()
    wrappers.running(holder)
    for _ in range(20):
        replacer = wrappers.start()
        wrappers.running(replacer)
        _, stderr = holder.communicate(timeout=60)
        assert holder.returncode == 75, stderr
        (line,) = stderr.splitlines()
        assert line.startswith(
            f"dislock: lease lost for lock {wrappers.env['LOCK_KEY']!r}:"
            f" replaced by {owner_of(replacer)}"
        ), line
        assert line.endswith("exit 75"), line
        holder = replacer
    commands = starts(wrappers.log)
    assert len(commands) == 21
    ends = [e for e in events(wrappers.log) if e.what == "end"]
    # Each replaced command got its SIGTERM and ended, before the next started.
    assert len(ends) == 20, events(wrappers.log)
    ordered = sorted(events(wrappers.log), key=lambda e: e.at)
    assert [e.what for e in ordered] == ["start"] + ["end", "start"] * 20, ordered
    assert all(a.pid == b.pid for a, b in zip(ordered[::2], ordered[1::2], strict=False))


def test_a_slots_run_replaces_the_previous_slots_run_still_going(wrappers: Wrappers) -> None:
    """``schedule,lease``: each slot starts once, and a run still going when the next
    slot starts is replaced (Kubernetes' ``concurrencyPolicy: Replace``)."""
    wrappers.env.update(LOCK_STRATEGY="schedule,lease", CRON_SCHEDULE="* * * * * *")
    holder = wrappers.start()
    first = wrappers.running(holder)
    time.sleep(1.1)  # the next slot: the holder's own is taken, and stays so
    replacer = wrappers.start()
    second = wrappers.running(replacer)
    _, stderr = holder.communicate(timeout=60)
    assert holder.returncode == 75 and f"replaced by {owner_of(replacer)}" in stderr, stderr
    assert second.at > first.at
    assert_one_at_a_time(wrappers.log)


def test_a_frozen_holder_is_replaced_once_its_guard_killed_its_command(
    wrappers: Wrappers,
) -> None:
    holder = wrappers.start()
    command = wrappers.running(holder)
    os.kill(holder.pid, signal.SIGSTOP)  # the wrapper only: its guard and command run on
    frozen = time.monotonic()
    replacer = wrappers.start(watch=command)
    started = wrappers.running(replacer)
    waited = time.monotonic() - frozen
    # The guard killed the command (no end logged: SIGKILL) before the row expired.
    assert not alive(command.pid)
    assert waited >= 3 - 2 * 0.3 - 0.5, waited  # about a TTL after the last renewal
    assert started.at > command.at
    assert_one_at_a_time(wrappers.log)


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (its guard and its command, for a wrapper)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def test_a_dead_holder_is_replaced_as_its_row_expires(wrappers: Wrappers) -> None:
    holder = wrappers.start()
    command = wrappers.running(holder)
    # The machine died: the wrapper, its guard and its command at once (the guard
    # and the command each lead a session of their own).
    helpers = children(holder.pid)
    assert command.pid in helpers and len(helpers) == 2, helpers
    for pid in (holder.pid, *helpers):
        os.kill(pid, signal.SIGKILL)
    died = time.monotonic()
    replacer = wrappers.start()
    wrappers.running(replacer)
    waited = time.monotonic() - died
    # Not before the row expired: a TTL (3 s) after the last renewal.
    assert waited >= 3 - 0.3 - 0.5, waited
    replacer.send_signal(signal.SIGTERM)
    _, stderr = replacer.communicate(timeout=60)
    assert "Traceback" not in stderr, stderr


def test_a_holder_that_ignores_sigterm_is_killed_before_its_row_can_expire(
    wrappers: Wrappers,
) -> None:
    """Its grace after SIGTERM ends at its lease's deadline, not 10 s later: the
    row stays live until then, and the replacer (or anyone) may take it after."""
    holder = wrappers.start(IGNORE_TERM="1")
    command = wrappers.running(holder)
    replacer = wrappers.start(watch=command)
    assert not wrappers.running(replacer).overlap
    _, stderr = holder.communicate(timeout=60)
    assert holder.returncode == 75, stderr
    (line,) = stderr.splitlines()
    assert "replaced by " in line and "SIGKILL after 10 s" not in line, line
    assert [e.what for e in events(wrappers.log) if e.pid == command.pid] == ["start", "term"]
    assert_one_at_a_time(wrappers.log)


def test_a_waiting_wrapper_does_not_slip_in_between(wrappers: Wrappers, tmp_path: Path) -> None:
    """A third wrapper waiting for the lease (no replace) is not woken by the
    hand-over: the replacer runs next, then the waiter once the replacer ends."""
    holder = wrappers.start()
    wrappers.running(holder)
    said = tmp_path / "waiter.stderr"
    with said.open("w") as stderr:
        waiter = subprocess.Popen(
            [*DISLOCK, "DATABASE_URL", sys.executable, "-c", COMMAND, str(wrappers.log)],
            env={
                **wrappers.env,
                "LOCK_REPLACE": "0",
                "LOCK_WAIT_SECONDS": "120",
                "CRONJOB_LOCK_LOG_LEVEL": "INFO",
            },
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
    wrappers.started.append(waiter)
    eventually(lambda: "is held; waiting up to 120 s" in said.read_text(), timeout=60)
    replacer = wrappers.start()
    wrappers.running(replacer)
    holder.communicate(timeout=60)
    assert holder.returncode == 75
    assert [e.wrapper for e in starts(wrappers.log)] == [holder.pid, replacer.pid]
    os.kill(replacer.pid, signal.SIGTERM)  # forwarded to its command; then released
    replacer.communicate(timeout=60)
    wrappers.running(waiter)
    assert [e.wrapper for e in starts(wrappers.log)] == [holder.pid, replacer.pid, waiter.pid]
    assert_one_at_a_time(wrappers.log)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"LOCK_STRATEGY": "schedule"}, "replacing the running holder needs the lease strategy"),
        ({"LOCK_SLOTS": "2"}, "cannot be combined with LOCK_SLOTS=2"),
        ({"LOCK_REPLACE": "maybe"}, "LOCK_REPLACE"),
    ],
)
def test_replace_where_it_cannot_apply_is_one_line_and_exit_2(
    replace_env: dict[str, str],
    run_cli: RunCli,
    tmp_path: Path,
    extra: dict[str, str],
    expected: str,
) -> None:
    marker = tmp_path / "ran"
    result = run_cli(["DATABASE_URL", "touch", str(marker)], {**replace_env, **extra})
    assert_refused_in_one_line(result, expected, marker)
