"""The README's crontab, as pasted, under Debian's real cron daemon, for two minutes.

Three unprivileged users stand for three machines. Each gets the README's crontab block and
environment file, and the retries-and-deadlines crontab of docs/getting-started.md, read from
the pages so they cannot drift; only the file's path, the URL, the directory on the ``PATH``
line, the jobs' commands, the schedules (so that two minutes see two slots, and the nightly
slot began an hour ago) and the retry delay (a second, not ten minutes) are put in.
``dislock`` comes from wheels built from this checkout, installed into a venv of their own
with the system Python, as a user's pipx would. Asserted: exactly one report per minute
across the three, the lease job never twice at once, the export that fails
its first attempt retried once and only once, and cron's mail (exim4,
delivered to ``/var/mail/USER``) arrives but never holds the password. A fourth user with a
``DATABASE_URL=`` line in its crontab shows that the mail check can fail.

Needs root, ``cron``, ``crontab``, exim4's ``sendmail`` and a system ``python3`` >= 3.11 that
the users can run (``.ci/run`` installs cron and exim4); skips otherwise.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from dislock.core.history import create_history, history_table
from dislock.core.table import create_table_sql
from tests.support.cluster import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.cron]

ROOT = Path(__file__).resolve().parents[2]
MACHINES = ("dislock-cron-1", "dislock-cron-2", "dislock-cron-3")
CONTROL = "dislock-cron-leaky"
SYSTEM_PYTHON = Path("/usr/bin/python3")
# What the pages' blocks say, replaced here; an edit that drops one fails loudly.
README_ENV_FILE = "/etc/dislock/jobs.env"
README_URL = "postgresql://jobs:secret@db.internal:5432/app"
README_BIN = "/home/jobs/.local/bin"
LEASE_SECONDS = 8


def _skip_reason() -> str | None:
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (creates users and starts the cron daemon)"
    for tool in ("cron", "crontab", "useradd", "userdel"):
        if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            return f"{tool} is not installed (apt-get install cron exim4)"
    if not Path("/usr/sbin/sendmail").exists():
        return "no /usr/sbin/sendmail (apt-get install exim4)"
    if not SYSTEM_PYTHON.exists():
        return f"no {SYSTEM_PYTHON} for the users' venv"
    pidfile = Path("/run/crond.pid")
    if pidfile.exists():
        pid = pidfile.read_text().strip()
        if pid.isdigit() and Path(f"/proc/{pid}").exists():
            return "a cron daemon is already running: the test starts its own"
    return None


def fenced_block(text: str, language: str, after: str) -> str:
    """The first ```language block after the line ``after``."""
    tail = text[text.index(after) :]
    match = re.search(rf"^```{language}\n(.*?)^```$", tail, flags=re.M | re.S)
    assert match, f"no ```{language} block after {after!r}"
    return match.group(1)


def replaced(text: str, old: str, new: str, count: int) -> str:
    assert text.count(old) == count, f"the block has {old!r} {text.count(old)} times"
    return text.replace(old, new)


def run(*args: str) -> None:
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{' '.join(args)}: {result.stdout}{result.stderr}"


def processes_of(uids: set[int]) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        uid = re.search(r"^Uid:\s+(\d+)", status, flags=re.M)
        if uid and int(uid.group(1)) in uids:
            found.append(entry.name)
    return found


def mails(user: str) -> list[str]:
    spool = Path("/var/mail") / user
    if not spool.exists():
        return []
    return [m for m in re.split(r"^From ", spool.read_text(errors="replace"), flags=re.M) if m]


def logged(log: Path, kind: str) -> list[tuple[str, float]]:
    """The (user, time) of each ``kind`` line the jobs wrote to ``log``."""
    lines = log.read_text().split("\n") if log.exists() else []
    return [
        (line.split()[1], float(line.split()[2]))
        for line in lines
        if line.startswith(f"{kind} ") and len(line.split()) == 3
    ]


def logged_attempts(log: Path) -> list[tuple[str, str, float]]:
    """The (user, attempt, time) of each export the jobs wrote to ``log``, by time."""
    lines = log.read_text().split("\n") if log.exists() else []
    found = [line.split()[1:] for line in lines if line.startswith("export ")]
    return sorted(((w[0], w[1], float(w[2])) for w in found if len(w) == 3), key=lambda a: a[2])


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A temporary directory the job users can reach (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="dislock-cron-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def users(workdir: Path) -> Iterator[dict[str, int]]:
    """The three machines' users and the control user, with homes (exim4 delivers only to
    users with one) and empty mailboxes; removed afterwards, crontabs and mail included."""
    uids = {}
    for user in (*MACHINES, CONTROL):
        subprocess.run(["userdel", "-r", user], capture_output=True, check=False)
        home = workdir / "home" / user
        home.parent.mkdir(exist_ok=True, mode=0o755)
        run("useradd", "--system", "--create-home", "--home-dir", str(home), "-s", "/bin/sh", user)
        (Path("/var/mail") / user).unlink(missing_ok=True)
        uids[user] = int(subprocess.check_output(["id", "-u", user], text=True))
    yield uids
    for user in uids:
        subprocess.run(["crontab", "-r", "-u", user], capture_output=True, check=False)
        subprocess.run(["userdel", "-r", user], capture_output=True, check=False)
        (Path("/var/mail") / user).unlink(missing_ok=True)


@pytest.fixture
def job_database() -> Iterator[tuple[str, str]]:
    """A server of the test's own on loopback TCP (the shared one's socket is not open to
    other users) with the lock table: its URL, password included, and the password."""
    cluster = Cluster()
    cluster.start()
    try:
        secret = f"cron-secret-{secrets.token_hex(6)}"  # trust auth: sent, never checked
        url = cluster.url.replace("postgres@", f"postgres:{secret}@", 1)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(create_table_sql(("key_value",)))
            for statement in create_history(history_table(("key_value",))):  # init --history
                conn.execute(statement)
        yield url, secret
    finally:
        cluster.destroy()


@pytest.fixture
def dislock_bin(workdir: Path) -> Path:
    """The bin directory of a venv (system Python) with dislock-cli from freshly built wheels."""
    sys.path.insert(0, str(ROOT))
    from tools.release_check import build_into

    wheels = workdir / "wheels"
    failed = build_into(wheels, ["wheel"], ["dislock-core", "dislock", "dislock-cli"])
    assert failed is None, failed
    venv = workdir / "venv"
    run(str(SYSTEM_PYTHON), "-m", "venv", str(venv))
    run(str(venv / "bin" / "pip"), "install", "--quiet", "--find-links", str(wheels), "dislock-cli")
    return venv / "bin"


@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
def test_the_readme_crontab_runs_once_a_minute_and_keeps_the_password_out_of_mail(
    workdir: Path, users: dict[str, int], job_database: tuple[str, str], dislock_bin: Path
) -> None:
    url, secret = job_database
    readme = (ROOT / "README.md").read_text()
    block = fenced_block(readme, "crontab", "## Wrapping a command")
    env_block = fenced_block(readme, "sh", "## Wrapping a command")
    guide = (ROOT / "docs" / "getting-started.md").read_text()
    retried_block = fenced_block(guide, "crontab", "## 5. Retries and a deadline")
    # The nightly slot, moved to have begun an hour ago (local time, as cron and the
    # wrapper read it): within its six-hour deadline, and not ending during the test.
    began = datetime.now().astimezone() - timedelta(hours=1)

    log = workdir / "runs.log"
    log.touch()
    log.chmod(0o666)  # every user appends to it, whoever wrote first
    jobs = workdir / "jobs"
    jobs.mkdir(mode=0o755)
    # Each prints a line, so that cron sends a mail for every run.
    (jobs / "report").write_text(
        f'#!/bin/sh\necho "report $(id -un) $(date +%s.%N)" >> {log}\necho "report done"\n'
    )
    (jobs / "import").write_text(
        f'#!/bin/sh\necho "import-start $(id -un) $(date +%s.%N)" >> {log}\n'
        f"sleep {LEASE_SECONDS}\n"
        f'echo "import-end $(id -un) $(date +%s.%N)" >> {log}\necho "import done"\n'
    )
    # Fails its first attempt, as a job with a bad night would; the retry succeeds.
    (jobs / "export").write_text(
        f'#!/bin/sh\necho "export $(id -un) $DISLOCK_ATTEMPT $(date +%s.%N)" >> {log}\n'
        'echo "export attempt $DISLOCK_ATTEMPT"\n[ "$DISLOCK_ATTEMPT" != 1 ]\n'
    )
    for script in jobs.iterdir():
        script.chmod(0o755)

    for user in MACHINES:
        env_file = workdir / "home" / user / "jobs.env"
        env_file.write_text(replaced(env_block, README_URL, url, 1))
        shutil.chown(env_file, user)
        env_file.chmod(0o600)
        crontab = replaced(block, README_ENV_FILE, str(env_file), 2)
        crontab = replaced(crontab, README_BIN, str(dislock_bin), 1)
        crontab = replaced(crontab, "python3 worker.py", str(jobs / "report"), 1)
        crontab = replaced(crontab, "python3 importer.py", str(jobs / "import"), 1)
        crontab = replaced(crontab, "0 3 * * *", "* * * * *", 2)
        crontab = replaced(crontab, "*/5 * * * *", "* * * * *", 1)
        retried = replaced(retried_block, README_ENV_FILE, str(env_file), 1)
        retried = replaced(retried, "python3 export.py", str(jobs / "export"), 1)
        retried = replaced(retried, "*/5 * * * *", "* * * * *", 1)
        retried = replaced(retried, "0 3 * * *", f"{began.minute} {began.hour} * * *", 1)
        retried = replaced(retried, "LOCK_RETRY_DELAY_SECONDS=600", "LOCK_RETRY_DELAY_SECONDS=1", 1)
        crontab += retried
        installed = workdir / f"{user}.crontab"
        installed.write_text(crontab)
        run("crontab", "-u", user, str(installed))
    # The control: the URL as a crontab variable, which cron copies into every mail.
    leaky = workdir / "leaky.crontab"
    leaky.write_text(f"DATABASE_URL={url}\n* * * * * echo control\n")
    run("crontab", "-u", CONTROL, str(leaky))

    # Start a few seconds into a minute, so that cron surely fires the next two.
    while not 3 <= time.time() % 60 <= 45:
        time.sleep(0.5)
    cron = subprocess.Popen(
        ["cron", "-f"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        first = (int(time.time()) // 60 + 1) * 60
        second = first + 60

        def done(kind: str) -> bool:
            return any(t >= second for _, t in logged(log, kind))

        def export_retried() -> bool:
            return len(logged_attempts(log)) >= 2

        # Wait for the second minute's report and import to end, and the export's retry,
        # then stop cron before it fires a third time.
        while time.time() < second + 55 and not (
            done("report") and done("import-end") and export_retried()
        ):
            assert cron.poll() is None, f"cron exited: {cron.communicate()[0]}"
            time.sleep(0.5)
    finally:
        cron.terminate()
        output = cron.communicate(timeout=30)[0]

    # Jobs outlive the daemon: wait until every one has ended.
    uids = set(users.values())
    deadline = time.monotonic() + 120
    while processes_of(uids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_of(uids), "jobs still running two minutes after cron stopped"

    events = log.read_text().split("\n") if log.exists() else []
    per_minute = Counter(int(t) // 60 * 60 for _, t in logged(log, "report"))
    if not per_minute[first] == per_minute[second] == 1:
        sent = "\n".join(f"--- {user}:\n" + "\n".join(mails(user)) for user in MACHINES)
        # pytest.fail, not assert: its message is not cut short without -vv.
        pytest.fail(f"reports per minute {dict(per_minute)}\n{events}\ncron: {output}\n{sent}")
    assert max(per_minute.values()) == 1, events

    # The lease: runs may follow each other, never overlap.
    starts: dict[str, list[float]] = {}
    intervals = []
    for line in events:
        if line.startswith("import-start "):
            starts.setdefault(line.split()[1], []).append(float(line.split()[2]))
        elif line.startswith("import-end "):
            intervals.append((starts[line.split()[1]].pop(0), float(line.split()[2])))
    intervals.sort()
    assert len(intervals) >= 2, events
    for (_, end), (start, _) in itertools.pairwise(intervals):
        assert start >= end, f"two imports at once: {intervals}"

    # The export failed once and was retried once, by whichever machine ticked first
    # after the delay; its success closed the night.
    attempts = logged_attempts(log)
    assert [attempt for _, attempt, _ in attempts] == ["1", "2"], events
    assert attempts[0][2] < attempts[1][2], events

    # Every run printed a line, so every run sent its user a mail.
    ran = Counter(
        line.split()[1] for line in events if line.startswith(("report ", "import-end ", "export "))
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (
        any(len(mails(user)) < ran[user] for user in MACHINES) or not mails(CONTROL)
    ):
        time.sleep(0.5)
    for user in MACHINES:
        delivered = mails(user)
        assert len(delivered) == ran[user], (user, ran, delivered)
        for mail in delivered:
            assert "X-Cron-Env: <PATH=" in mail, mail  # cron does list the crontab's variables
            assert secret not in mail, f"the password is in {user}'s mail:\n{mail}"
            assert "not found" not in mail, mail
    assert mails(CONTROL), "the control user got no mail: the mail check would prove nothing"
    assert all(secret in mail for mail in mails(CONTROL)), mails(CONTROL)

    # The env file's LOCK_HISTORY=1 recorded every run, on whichever machine it ran.
    with psycopg.connect(url, autocommit=True) as conn:
        recorded = conn.execute(
            "SELECT lock_key, outcome, count(*) FROM key_value_history GROUP BY 1, 2 ORDER BY 1, 2"
        ).fetchall()
    assert recorded == [
        ("daily-report", "ok", sum(per_minute.values())),
        ("importer", "ok", len(intervals)),
        ("nightly-export", "failed", 1),
        ("nightly-export", "ok", 1),
    ], recorded
