"""The wrapper as a supervisor: signals, process groups, parent death, exit codes."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dislock.core.rows import lease_key
from tests.cli.conftest import DISLOCK, RunCli
from tests.support.eventually import wait_for
from tests.support.processes import alive
from tests.support.rows import Rows


def wait_dead(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def read_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The next line of the wrapper's stderr, waiting ``timeout`` seconds at most."""
    assert process.stderr is not None
    ready, _, _ = select.select([process.stderr], [], [], timeout)
    assert ready, f"no line on stderr within {timeout} s"
    return process.stderr.readline()


_started: list[subprocess.Popen[str]] = []


def start(env: dict[str, str], script: str, *via: str) -> subprocess.Popen[str]:
    """``dislock`` running ``sh -c script``, through the command ``via`` if given."""
    process = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", *via, "sh", "-c", script],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    _started.append(process)
    return process


@pytest.fixture(autouse=True)
def _no_wrapper_outlives_its_test() -> Iterator[None]:
    """A test that failed half-way must not leave its wrapper to the next one."""
    yield
    while _started:
        process = _started.pop()
        if process.poll() is None:
            process.kill()  # its guard then kills the command's group
        process.communicate(timeout=10)


@pytest.mark.parametrize(
    "signum",
    [
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
    ],
    ids=lambda s: signal.Signals(s).name,
)
def test_signal_is_forwarded_and_the_lock_released_after_the_child_exits(
    short_lease_env: dict[str, str], rows: Rows, tmp_path: Path, signum: int
) -> None:
    started, got, finish = tmp_path / "started", tmp_path / "got", tmp_path / "finish"
    name = signal.Signals(signum).name[3:]
    # The child winds down after the signal until the test lets it finish, then exits 7
    # (a fixed wind-down would race the checks below on a loaded machine).
    script = (
        f'trap \'echo {name} > "{got}"; while [ ! -e "{finish}" ]; do sleep 0.05; done;'
        f" exit 7' {name}; "
        f'touch "{started}"; while :; do sleep 0.05; done'
    )
    process = start(short_lease_env, script)
    wait_for(started)
    process.send_signal(signum)
    wait_for(got)
    assert got.read_text().strip() == name
    time.sleep(0.3)  # a wrapper that did not wait for its child would be gone by now
    row = rows.get(lease_key(short_lease_env["LOCK_KEY"]))
    assert process.poll() is None  # still waiting for the child
    assert row is not None and not row.expired  # and still holding the lease
    finish.touch()

    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 7, stderr
    row = rows.get(lease_key(short_lease_env["LOCK_KEY"]))
    assert row is not None and row.expired  # released once the child was gone


def test_a_signal_sent_the_moment_the_command_starts_reaches_it(
    short_lease_env: dict[str, str], tmp_path: Path
) -> None:
    """The wrapper handles the signals before it starts the command: the command's
    first act can be to signal the wrapper, and the signal comes back to it."""
    got = tmp_path / "got"
    script = f"trap 'echo QUIT > \"{got}\"; exit 7' QUIT; kill -s QUIT $PPID; sleep 30 & wait"
    process = start(short_lease_env, script)
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 7, stderr
    assert got.read_text().strip() == "QUIT"


def test_lease_loss_kills_the_whole_process_group(
    short_lease_env: dict[str, str], rows: Rows, tmp_path: Path
) -> None:
    started, grandchild = tmp_path / "started", tmp_path / "grandchild.pid"
    script = f'sleep 600 & echo $! > "{grandchild}"; touch "{started}"; wait'
    process = start(short_lease_env, script)
    wait_for(started)
    pid = int(grandchild.read_text())
    assert alive(pid)
    key = lease_key(short_lease_env["LOCK_KEY"])
    rows.steal(key)
    stolen = rows.get(key)
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 75, stderr
    # One line, in the operator's terms: which lock, why, what happened to the command.
    assert stderr.count("\n") == 1, stderr
    assert re.fullmatch(
        rf"dislock: lease lost for lock '{short_lease_env['LOCK_KEY']}': the lock row is no longer"
        r" ours \(.*\); terminating sh \(pid \d+, SIGKILL after 10 s\), exit 75\n",
        stderr,
    ), stderr
    assert wait_dead(pid, timeout=5)
    assert rows.get(key) == stolen  # the thief's row is untouched


def test_a_command_that_makes_its_own_process_group_stays_in_reach(
    short_lease_env: dict[str, str], rows: Rows, tmp_path: Path
) -> None:
    """GNU ``timeout`` calls ``setpgid(0, 0)``: as the leader of its own session the
    command is already its group's leader, so it stays in the group the wrapper
    signals, and a lost lease still ends it and what it started."""
    started, grandchild = tmp_path / "started", tmp_path / "grandchild.pid"
    script = f'sleep 600 & echo $! > "{grandchild}"; touch "{started}"; wait'
    process = start(short_lease_env, script, "timeout", "600")
    wait_for(started)
    pid = int(grandchild.read_text())
    rows.steal(lease_key(short_lease_env["LOCK_KEY"]))
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 75, stderr
    assert wait_dead(pid, timeout=5)


def test_lease_loss_under_continue_is_one_line_and_the_command_finishes(
    short_lease_env: dict[str, str], rows: Rows, tmp_path: Path
) -> None:
    started, finish = tmp_path / "started", tmp_path / "finish"
    script = f'touch "{started}"; while [ ! -e "{finish}" ]; do sleep 0.05; done; exit 4'
    process = start({**short_lease_env, "LOCK_ON_LEASE_LOSS": "continue"}, script)
    wait_for(started)
    rows.steal(lease_key(short_lease_env["LOCK_KEY"]))
    loss = read_line(process, timeout=20)  # the loss has been seen, however slowly
    assert process.poll() is None  # still running
    finish.touch()
    _, rest = process.communicate(timeout=20)
    assert process.returncode == 4, loss + rest
    assert rest == "", loss + rest  # that one line
    assert re.fullmatch(
        rf"dislock: lease lost for lock '{short_lease_env['LOCK_KEY']}': .*;"
        r" sh keeps running \(lease loss policy: continue\)\n",
        loss,
    ), loss


@pytest.mark.slow
def test_child_ignoring_sigterm_is_killed_after_the_grace_period(
    short_lease_env: dict[str, str], rows: Rows, tmp_path: Path
) -> None:
    started, child = tmp_path / "started", tmp_path / "child.pid"
    script = f'trap "" TERM; echo $$ > "{child}"; touch "{started}"; while :; do sleep 0.05; done'
    process = start(short_lease_env, script)
    wait_for(started)
    stolen_at = time.monotonic()
    rows.steal(lease_key(short_lease_env["LOCK_KEY"]))
    _, stderr = process.communicate(timeout=30)
    elapsed = time.monotonic() - stolen_at
    assert process.returncode == 75, stderr
    assert elapsed >= 10.0  # SIGTERM was ignored; SIGKILL came after the grace period
    assert wait_dead(int(child.read_text()), timeout=5)


def test_child_dies_when_the_wrapper_is_killed(
    short_lease_env: dict[str, str], tmp_path: Path
) -> None:
    started, child = tmp_path / "started", tmp_path / "child.pid"
    script = f'echo $$ > "{child}"; touch "{started}"; while :; do sleep 0.05; done'
    process = start(short_lease_env, script)
    wait_for(started)
    pid = int(child.read_text())
    process.kill()
    process.communicate(timeout=10)
    assert wait_dead(pid, timeout=15)


@pytest.mark.parametrize(
    ("script", "status"),
    [("exit 0", 0), ("exit 42", 42), ("kill -TERM $$", 143), ("kill -KILL $$", 137)],
)
def test_exit_status_of_the_command_is_propagated(
    run_cli: RunCli, short_lease_env: dict[str, str], script: str, status: int
) -> None:
    result = run_cli(["DATABASE_URL", "sh", "-c", script], short_lease_env)
    assert result.returncode == status, result.stderr


def test_lock_held_elsewhere_exits_0_quietly_and_logs_at_info(
    run_cli: RunCli, cli_env: dict[str, str], tmp_path: Path
) -> None:
    first = run_cli(["DATABASE_URL", "true"], cli_env)
    assert first.returncode == 0
    marker = tmp_path / "ran"
    quiet = run_cli(["DATABASE_URL", "touch", str(marker)], cli_env)
    assert quiet.returncode == 0
    assert quiet.stderr == "" and quiet.stdout == ""
    assert not marker.exists()

    verbose = run_cli(
        ["DATABASE_URL", "touch", str(marker)], {**cli_env, "CRONJOB_LOCK_LOG_LEVEL": "INFO"}
    )
    assert verbose.returncode == 0
    assert "not running touch" in verbose.stderr
    assert not marker.exists()


def test_spec_examples_run_unchanged(run_cli: RunCli, cli_env: dict[str, str]) -> None:
    base = {k: v for k, v in cli_env.items() if k not in ("LOCK_KEY", "CRON_SCHEDULE")}
    examples = [
        {"LOCK_KEY": "daily-report", "CRON_SCHEDULE": "0 3 * * *"},
        {"LOCK_KEY": "importer", "LOCK_STRATEGY": "lease", "RUN_LOCK_TTL_SECONDS": "120"},
        {
            "LOCK_KEY": "etl",
            "LOCK_STRATEGY": "schedule,lease",
            "CRON_SCHEDULE": "*/15 * * * *",
            "RUN_LOCK_TTL_SECONDS": "60",
        },
    ]
    for example in examples:
        result = run_cli(
            ["DATABASE_URL", "python3", "-c", "print('worker ran')"], {**base, **example}
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout == "worker ran\n"


def test_console_script(cli_env: dict[str, str]) -> None:
    script = Path(sys.executable).parent / "dislock"
    result = subprocess.run(
        [str(script), "DATABASE_URL", "sh", "-c", "exit 5"],
        env=cli_env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 5, result.stderr


@pytest.mark.parametrize("strategy", ["lease", "schedule"])
def test_killing_the_wrapper_kills_the_whole_group(
    short_lease_env: dict[str, str], tmp_path: Path, strategy: str
) -> None:
    # The measurement: `sh -c 'sleep 600; true'`, kill -9 of dislock.
    started, grandchild = tmp_path / "started", tmp_path / "grandchild.pid"
    script = f'sleep 600 & echo $! > "{grandchild}"; touch "{started}"; wait; true'
    process = start({**short_lease_env, "LOCK_STRATEGY": strategy}, script)
    wait_for(started)
    pids = [int(grandchild.read_text())]
    assert alive(pids[0])
    process.kill()
    process.communicate(timeout=10)
    assert wait_dead(pids[0], timeout=1.0)  # the bound: within 1 s


@pytest.mark.parametrize("flavour", ["sync", "aio"])
def test_killing_the_wrapper_just_after_it_started_the_command_kills_the_group(
    flavour: str, database_url: str, lock_table: tuple[str, str], tmp_path: Path
) -> None:
    """``tests.support.guard_window`` holds the wrapper for 2 s right after the command
    has started, as a loaded machine may; the kill -9 lands in that window, before
    the guard was told the group: it finds the command by the run's token."""
    root = Path(__file__).resolve().parents[2]
    args = [flavour, database_url, lock_table[0], "job", str(tmp_path)]
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.guard_window", *args], cwd=root
    )
    try:
        wait_for(tmp_path / "started")
        pid = int((tmp_path / "pid").read_text())
        process.kill()
        process.wait(timeout=10)
        dead = wait_dead(pid, timeout=1.0)  # the bound: within 1 s
    finally:
        with contextlib.suppress(ProcessLookupError, ValueError, FileNotFoundError):
            os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
        if process.poll() is None:
            process.kill()
            process.wait()
    assert dead, "the command's group outlived its wrapper"


def test_group_members_left_behind_are_stopped_before_the_lease_is_released(
    short_lease_env: dict[str, str], rows: Rows, tmp_path: Path
) -> None:
    # The command's own process exits at once, leaving a helper that winds down
    # after SIGTERM until the test lets it finish: the lease is held until it is gone.
    helper, got, program = tmp_path / "helper.pid", tmp_path / "got", tmp_path / "helper.sh"
    finish = tmp_path / "finish"
    program.write_text(
        f'trap \'touch "{got}"; while [ ! -e "{finish}" ]; do sleep 0.05; done; exit 0\' TERM\n'
        "sleep 600 & wait\n"
    )
    script = f'sh "{program}" & echo $! > "{helper}"; sleep 0.3; exit 3'
    process = start(short_lease_env, script)
    wait_for(got, timeout=20)
    pid = int(helper.read_text())
    time.sleep(0.3)
    assert process.poll() is None  # waiting for the helper
    row = rows.get(lease_key(short_lease_env["LOCK_KEY"]))
    assert row is not None and not row.expired
    finish.touch()
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 3, stderr  # still the command's own status
    assert "still run" in stderr
    assert not alive(pid)
    row = rows.get(lease_key(short_lease_env["LOCK_KEY"]))
    assert row is not None and row.expired


def test_group_member_ignoring_sigterm_after_the_command_exits_gets_sigkill(
    short_lease_env: dict[str, str], tmp_path: Path
) -> None:
    helper = tmp_path / "helper.pid"
    script = f'sh -c \'trap "" TERM; while :; do sleep 0.05; done\' & echo $! > "{helper}"; exit 0'
    env = {**short_lease_env}
    process = start(env, script)
    wait_for(helper)
    pid = int(helper.read_text())
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert not alive(pid)


def test_a_process_that_leaves_the_group_escapes(
    short_lease_env: dict[str, str], tmp_path: Path
) -> None:
    # Documented in docs/guarantees.md: setsid (a daemon) leaves the group, and
    # with it the wrapper's reach; a systemd scope or cgroup contains it.
    escaped = tmp_path / "escaped.pid"
    script = (
        f"setsid -f sh -c 'echo $$ > \"{escaped}\"; exec sleep 600' </dev/null >/dev/null 2>&1; "
        f'while [ ! -s "{escaped}" ]; do sleep 0.02; done'
    )
    process = start(short_lease_env, script)
    wait_for(escaped)
    time.sleep(0.1)
    pid = int(escaped.read_text())
    try:
        _, stderr = process.communicate(timeout=20)
        assert process.returncode == 0, stderr
        assert alive(pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_command_at_a_terminal_can_read_it(short_lease_env: dict[str, str]) -> None:
    """A wrapper with a controlling terminal (a person at it) starts its command in a
    session of its own, not in a group of the wrapper's session, where reading the
    terminal would stop it (SIGTTIN) for good."""
    import pty
    import select

    root = Path(__file__).resolve().parents[2]
    argv = [*DISLOCK, "DATABASE_URL", "sh", "-c", 'read -r line; echo "got:$line"']
    pid, master = pty.fork()  # the child leads a session whose terminal is the pty
    if pid == 0:
        try:
            os.chdir(root)
            os.execvpe(argv[0], argv, short_lease_env)
        finally:
            os._exit(127)
    output = b""
    try:
        os.write(master, b"hello\n")
        deadline = time.monotonic() + 30
        while b"got:hello" not in output and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    output += os.read(master, 4096)
                except OSError:  # the terminal closed: the wrapper is gone
                    break
    finally:
        if b"got:hello" not in output:  # stopped for good: end it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(master)
    assert b"got:hello" in output, output.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    found.append(int(entry))
    return found


def test_the_guard_shows_no_token_and_needs_no_path(
    short_lease_env: dict[str, str], tmp_path: Path
) -> None:
    """The guard is this interpreter on the guard's module, by absolute paths, with the
    run's token in its environment only (``/proc/PID/cmdline`` is world-readable); it
    runs no program of its own, so a wrapper without a usable ``PATH`` is guarded too."""
    import shutil

    started, grandchild = tmp_path / "started", tmp_path / "grandchild.pid"
    sleep = shutil.which("sleep")
    assert sleep is not None
    script = f'{sleep} 600 & echo $! > "{grandchild}"; : > "{started}"; wait'
    env = {**short_lease_env, "PATH": str(tmp_path / "nothing-here")}
    process = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "/bin/sh", "-c", script], env=env, stderr=subprocess.PIPE
    )
    try:
        wait_for(started)
        children = {
            pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in _children(process.pid)
        }
        guards = [pid for pid, cmdline in children.items() if b"dislock-guard" in cmdline]
        commands = [pid for pid in children if pid not in guards]
        assert len(guards) == 1 and len(commands) == 1, children
        argv = children[guards[0]].split(b"\0")[:-1]
        assert argv[1:3] == [b"-I", b"-S"] and argv[-1] == b"dislock-guard"
        assert os.path.isabs(argv[0]) and os.path.isabs(argv[3])
        assert argv[3].endswith(b"/dislock/core/guard.py")
        token = next(
            line.split(b"=", 1)[1]
            for line in Path(f"/proc/{commands[0]}/environ").read_bytes().split(b"\0")
            if line.startswith(b"DISLOCK_RUN_TOKEN=")
        )
        assert token not in children[guards[0]]
        guard_env = Path(f"/proc/{guards[0]}/environ").read_bytes().split(b"\0")
        assert b"DISLOCK_GUARD_FOR=" + token in guard_env
        pid = int(grandchild.read_text())
    finally:
        process.kill()
        process.communicate(timeout=10)
    assert wait_dead(pid, timeout=1.0)
