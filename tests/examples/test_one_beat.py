"""docs/recipes.md's "One active Celery beat, with a hot standby", run as it is written.

Two beats of examples/one_beat.py, each wrapped in ``dislock`` on one lease with a long
wait, as the page's command line has it (a short TTL here), each sending into a broker
folder of its own: kombu's filesystem transport writes one file per message, so the
files in a folder are what that beat sent. Exactly one folder grows while both run; once
the active wrapper is SIGKILLed, its beat is gone at once (the wrapper's guard kills the
group), its folder stops, and the standby's starts growing within the TTL and some slack.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.examples.test_scheduler_recipes import (
    ROOT,
    recipe_in_docs,
    recipe_url,  # noqa: F401 (the fixture: a database of the test's own)
)
from tests.support.eventually import eventually
from tests.support.processes import alive
from tests.support.waiting import WAITS

pytestmark = pytest.mark.slow

# The page's command line: the lock's variables, then the wrapped beat.
LOCK = (
    "LOCK_KEY=celery-beat\nLOCK_STRATEGY=lease\nRUN_LOCK_TTL_SECONDS=30\nLOCK_WAIT_SECONDS=86400\n"
)
"""The lock's lines of the page's environment file."""
BEAT = "celery -A examples.one_beat beat --loglevel=INFO"
TTL = 5
"""The test's lease, shorter than the page's 30 s so that a takeover comes quickly."""
SLACK = 10
"""What a takeover may take beyond the TTL on a loaded machine (the standby's poll,
up to 2 s on a direct connection, and the scheduler's delays)."""
BEAT_START = 60
"""How long a beat may take to start and send once its wrapper holds the lease."""
WATCH = 6.0
"""How long each phase is watched, in seconds."""


@dataclass
class Beat:
    """One machine: a wrapped beat, its broker folder and its log."""

    home: Path
    wrapper: subprocess.Popen[bytes] = field(init=False)

    @property
    def broker(self) -> Path:
        return self.home / "broker"

    @property
    def schedule(self) -> Path:
        return self.home / "celerybeat-schedule"

    @property
    def log(self) -> Path:
        return self.home / "output.log"

    def start(self, url: str) -> None:
        self.broker.mkdir(parents=True)
        env = {
            **os.environ,
            **{name: value for name, _, value in (pair.partition("=") for pair in LOCK.split())},
            "RUN_LOCK_TTL_SECONDS": str(TTL),
            "LOCK_LEASE_INTERVAL": "1",
            "LOCK_WAIT_POLL_SECONDS": "0.5",
            "CRONJOB_LOCK_LOG_LEVEL": "INFO",  # the waiter says that it waits
            "DATABASE_URL": url,
            "CELERY_BROKER_FOLDER": str(self.broker),
        }
        command = [sys.executable, "-m", "dislock.cli", "DATABASE_URL", sys.executable, "-m"]
        command += [*BEAT.split(), "-s", str(self.schedule)]
        with self.log.open("wb") as out:
            # A session of its own, so that the wrapper and its guard can be killed
            # together at the end; the beat leads a session of its own anyway.
            self.wrapper = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def sent(self) -> int:
        """How many messages this beat has sent."""
        return sum(1 for _ in self.broker.glob("*.msg"))

    def beat_pids(self) -> list[int]:
        """The running beat processes of this machine (not its wrapper or guard)."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if str(self.schedule) in argv and "dislock.cli" not in argv and alive(int(proc.name)):
                found.append(int(proc.name))
        return found

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def counts(beats: list[Beat]) -> list[int]:
    return [beat.sent() for beat in beats]


def test_one_beat_sends_and_the_standby_takes_over(recipe_url: str, tmp_path: Path) -> None:  # noqa: F811
    recipe_in_docs("one_beat")
    page = (ROOT / "docs" / "recipes.md").read_text()
    assert LOCK in page and f"dislock DATABASE_URL {BEAT}" in page

    beats = [Beat(tmp_path / f"machine-{n}") for n in range(2)]
    group_leaders: set[int] = set()
    try:
        for beat in beats:
            beat.start(recipe_url)

        def report() -> str:
            return "\n".join(f"--- {b.home.name}: {b.sent()} sent\n{b.output()}" for b in beats)

        # One of them takes the lease and sends; the other says that it waits.
        eventually(lambda: any(counts(beats)), timeout=120, message=report)
        active, standby = beats if beats[0].sent() else beats[::-1]
        eventually(lambda: WAITS in standby.output(), timeout=60, message=report)
        for beat in beats:
            assert beat.wrapper.poll() is None, report()

        # (1) Both up: only the active beat sends.
        first = active.sent()
        deadline = time.monotonic() + WATCH
        while time.monotonic() < deadline:
            assert standby.sent() == 0, f"both beats sent:\n{report()}"
            time.sleep(0.1)
        assert active.sent() - first >= 2, f"the active beat stopped sending:\n{report()}"
        assert standby.sent() == 0 and standby.wrapper.poll() is None, report()

        # (2) SIGKILL the active wrapper: its guard kills the beat's group at once.
        (killed_beat,) = active.beat_pids()
        group_leaders.add(killed_beat)
        at_kill = active.sent()
        killed = time.monotonic()
        os.kill(active.wrapper.pid, signal.SIGKILL)
        active.wrapper.wait()
        eventually(
            lambda: not alive(killed_beat),
            timeout=5,
            message=lambda: f"the beat outlived its killed wrapper:\n{report()}",
        )
        beat_gone = time.monotonic() - killed
        after_kill = active.sent()
        # A message in flight at the kill may still land; nothing after that.
        assert after_kill - at_kill <= 1, report()

        # The takeover is dislock's: the standby's wrapper holds the lease within the
        # TTL, its poll and some slack.  Beat's own start-up after that (importing
        # Celery, its first interval) is Celery's, and a loaded machine stretches it.
        eventually(
            lambda: "acquired lease" in standby.output(), timeout=TTL + SLACK, message=report
        )
        took_over = time.monotonic() - killed
        eventually(lambda: standby.sent(), timeout=BEAT_START, message=report)
        group_leaders.update(standby.beat_pids())

        # (3) After the takeover: only the standby sends, never both in one interval.
        previous = counts(beats)
        deadline = time.monotonic() + WATCH
        while time.monotonic() < deadline:
            time.sleep(0.2)
            now = counts(beats)
            grew = [b > a for a, b in zip(previous, now, strict=True)]
            assert not all(grew), f"both beats sent in one interval:\n{report()}"
            previous = now
        assert active.sent() == after_kill, f"the killed side sent again:\n{report()}"
        assert standby.sent() >= 3, f"the standby stopped sending:\n{report()}"
        assert standby.wrapper.poll() is None, report()
        assert "Traceback" not in report(), report()
        print(
            f"beat gone {beat_gone:.2f} s after the kill;"
            f" the standby held the lease {took_over:.2f} s after it"
        )
    finally:
        # Each wrapper's session (the wrapper and its guard), then each beat's.
        started = [beat for beat in beats if hasattr(beat, "wrapper")]
        for beat in started:
            group_leaders.update(beat.beat_pids())
            with contextlib.suppress(ProcessLookupError):
                os.killpg(beat.wrapper.pid, signal.SIGKILL)
        for leader in group_leaders:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(leader, signal.SIGKILL)
        for beat in started:
            beat.wrapper.wait()
