"""Helpers for the ``dislockctl serve`` tests: run it, scrape it, and a fleet of real runs."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from dislock.core.operator_commands import PAUSE_MODES
from dislock.core.pause import pausing
from dislock.core.rows import lease_key, schedule_key
from tests.cli.conftest import DISLOCK
from tests.support.eventually import eventually, wait_for

CTL = [sys.executable, "-m", "dislock.cli.ctl"]
LISTENING = re.compile(r"listening on (http://\S+/)")
Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Served:
    base: str
    process: subprocess.Popen[str]
    log: list[str] = field(default_factory=list)
    timeout: float = 30.0
    """Seconds a request may take (a test of a fleet of thousands of keys gives more)."""

    def get(self, path: str) -> tuple[int, str, str]:
        """Status, content type and body of GET ``path``."""
        try:
            with urllib.request.urlopen(
                self.base + path.lstrip("/"), timeout=self.timeout
            ) as answer:
                return answer.status, answer.headers["Content-Type"], answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()

    def metrics(self) -> Metrics:
        """Every sample of /metrics, parsed back by prometheus_client: (name, labels) -> value."""
        status, kind, body = self.get("/metrics")
        assert status == 200 and kind.startswith("text/plain"), (status, kind)
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body)
            for sample in family.samples
        }


@contextmanager
def serving(env: dict[str, str], *args: str) -> Iterator[Served]:
    """``dislockctl DATABASE_URL serve`` on a free loopback port, stopped by SIGTERM at the
    end, which must exit 0."""
    process = subprocess.Popen(
        [*CTL, "DATABASE_URL", "serve", "--listen", "127.0.0.1:0", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    served = Served("", process)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            served.log.append(line)
            found = LISTENING.search(line)
            if found:
                served.base = found.group(1)
                break
        assert served.base, f"serve did not start: {''.join(served.log)}"
        yield served
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
        served.log += [out, err]
    assert process.returncode == 0, "".join(served.log)


def run_job(
    env: dict[str, str], *command: str, **overrides: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DISLOCK, "DATABASE_URL", *command],
        env={**env, **overrides},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def sample(
    metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float | None:
    return metrics.get((name, tuple(sorted(labels.items()))))


@dataclass
class Fleet:
    """Lock keys that went through real runs, one per outcome."""

    ok: str
    failed: str
    lost: str
    abandoned: str
    paused: str
    missed: str
    missed_slot_end: datetime
    """The end of the missed key's one run's slot (ten minutes back)."""
    missed_from: datetime
    """The database clock when that run was moved back."""

    def missed_expected(self, until: datetime) -> range:
        """The slots the missed key missed by a scrape between moving its run back
        and ``until`` (the database clock read after the scrape): every minute from
        the end of its slot to a minute (the grace) before the scrape began one."""

        def missed_at(now: datetime) -> int:
            return int((now.timestamp() - 60 - self.missed_slot_end.timestamp()) // 60) + 1

        return range(missed_at(self.missed_from), missed_at(until) + 1)


def ctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CTL, "DATABASE_URL", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def make_fleet(env: dict[str, str], db: psycopg.Connection[Any], tmp: Path) -> Fleet:
    base = env["LOCK_KEY"]
    fleet = Fleet(
        ok=f"{base}-ok",
        failed=f"{base}-failed",
        lost=f"{base}-lost",
        abandoned=f"{base}-abandoned",
        paused=f"{base}-paused",
        missed=f"{base}-missed",
        missed_slot_end=datetime.now(timezone.utc),  # set below
        missed_from=datetime.now(timezone.utc),
    )
    lease = {"LOCK_STRATEGY": "lease", "RUN_LOCK_TTL_SECONDS": "3", "LOCK_LEASE_INTERVAL": "1"}

    # (A lease-only job records its CRON_SCHEDULE when it has one; this one has none.)
    assert run_job(env, "true", LOCK_KEY=fleet.ok, CRON_SCHEDULE="", **lease).returncode == 0
    assert run_job(env, "sh", "-c", "exit 3", LOCK_KEY=fleet.failed, **lease).returncode == 3

    # Lost: an operator force-releases the lease while the command runs.
    started = tmp / "lost-started"
    holder = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", f"touch {started}; sleep 60"],
        env={**env, "LOCK_KEY": fleet.lost, **lease},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(started)
    assert ctl({**env, "LOCK_KEY": fleet.lost}, "release", fleet.lost).returncode == 0
    assert holder.wait(timeout=60) == 75

    # Abandoned: the wrapper dies (SIGKILL) and its lease runs out.
    started = tmp / "abandoned-started"
    doomed = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", f"touch {started}; sleep 60"],
        env={**env, "LOCK_KEY": fleet.abandoned, **lease},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(started)
    doomed.kill()
    doomed.wait(timeout=30)

    # Paused: it ran once, then an operator paused it; the next start is skipped.
    assert run_job(env, "true", LOCK_KEY=fleet.paused, **lease).returncode == 0
    schema, table = env["LOCK_TABLE"].split(".")
    paused = pausing((schema, table), fleet.paused, "disk <full> & slow", seconds=3600)
    db.execute(paused.query, paused.params)
    skipped = run_job(env, "sh", "-c", "echo ran", LOCK_KEY=fleet.paused, **lease)
    assert skipped.returncode == 0 and skipped.stdout == ""

    # Missed: a run every minute, and then none for ten minutes (its run moved back
    # in time, the way the clock would have moved on).
    every_minute = {"LOCK_STRATEGY": "schedule", "CRON_SCHEDULE": "* * * * *"}
    assert run_job(env, "true", LOCK_KEY=fleet.missed, **every_minute).returncode == 0
    history = sql.Identifier(schema, f"{table}_history")
    shifted = db.execute(
        sql.SQL(
            "UPDATE {} SET started_at = started_at - interval '10 minutes',"
            " ended_at = ended_at - interval '10 minutes',"
            " slot_end = slot_end - interval '10 minutes'"
            " WHERE lock_key = %s RETURNING slot_end, NOW()"
        ).format(history),
        (fleet.missed,),
    ).fetchone()
    assert shifted is not None
    fleet.missed_slot_end, fleet.missed_from = shifted
    # The abandoned lease (TTL 3 s from its last renewal) runs out.
    abandoned = sql.SQL("SELECT expire_at > NOW() FROM {} WHERE key = %s").format(
        sql.Identifier(schema, table)
    )
    eventually(
        lambda: db.execute(abandoned, (lease_key(fleet.abandoned),)).fetchone() == (False,),
        interval=0.1,
        message="the abandoned lease did not run out",
    )
    return fleet


EVERY_MINUTE = {"LOCK_STRATEGY": "schedule", "CRON_SCHEDULE": "* * * * *", "CRON_TZ": "UTC"}

STRIP_PLAN = {
    30: ("ok", "done"),
    28: ("fail", "failed"),
    27: ("ok", "done"),
    26: ("overrun", "timed_out"),
    24: ("ok", "done"),
    23: ("held back", "held_back"),
    19: ("ok", "done"),
    18: ("ok", "done"),
    16: ("fail", "failed"),
    14: ("ok", "done"),
    13: ("ok", "done"),
    11: ("overrun", "timed_out"),
    9: ("ok", "done"),
    8: ("ok", "done"),
    7: ("fail", "failed"),
    5: ("ok", "done"),
}
"""The strip key's runs: minutes back (from the setup's minute) of the start of their
slot, what ran, the slot's state.  Besides them: paused from 22 to 20, running from 3
(the slots after it covered by its lease), the others missed."""

COMMANDS = {
    "ok": (["sh", "-c", "sleep 0.2"], {}, 0),
    "fail": (["false"], {}, 1),
    "overrun": (["sleep", "30"], {"LOCK_MAX_RUNTIME_SECONDS": "1"}, 124),
    "held back": (["true"], {"LOCK_AFTER": "a-key-that-never-ran"}, 0),
}


@dataclass
class StripKey:
    """A key every minute whose last half hour of slots went through every state."""

    key: str
    minute: datetime
    """The minute (database clock) the plan counts back from."""
    running: subprocess.Popen[str]

    def expected(self, slot_start: datetime) -> str:
        back = round((self.minute - slot_start).total_seconds() / 60)
        if back in STRIP_PLAN:
            return STRIP_PLAN[back][1]
        if back == 3:
            return "running"
        return "paused" if 20 <= back <= 22 else "covered" if back < 3 else "missed"


def make_strip_key(env: dict[str, str], db: psycopg.Connection[Any], tmp: Path) -> StripKey:
    """Real wrappers and ``dislockctl pause``/``resume``, each run then moved back into its
    slot of ``STRIP_PLAN`` as the clock would have moved on (its slot's row let go, as the
    next minute would have); last, a wrapper left running (stop it: ``running``)."""
    key = f"{env['LOCK_KEY']}-strip"
    schema, table = env["LOCK_TABLE"].split(".")
    history = sql.Identifier(schema, f"{table}_history")
    found = db.execute("SELECT date_trunc('minute', NOW())").fetchone()
    assert found is not None
    minute: datetime = found[0]
    job = {**env, **EVERY_MINUTE, "LOCK_KEY": key}

    def into_slot(back: int, *, let_go: bool = True) -> None:
        # The rows not moved yet (their slot ends after the setup's minute) keep their
        # place within their slot.
        db.execute(
            sql.SQL(
                "UPDATE {} SET started_at = started_at - (slot_end - %(end)s),"
                " ended_at = ended_at - (slot_end - %(end)s), slot_end = %(end)s"
                " WHERE lock_key = %(key)s AND slot_end > %(minute)s AND modes <> %(pause)s"
            ).format(history),
            {
                "key": key,
                "end": minute - timedelta(minutes=back - 1),
                "minute": minute,
                "pause": PAUSE_MODES,
            },
        )
        if let_go:
            db.execute(
                sql.SQL("DELETE FROM {} WHERE key = %s").format(sql.Identifier(schema, table)),
                (schedule_key(key),),
            )

    for back in range(40, 30, -1):  # ten successes before: the key's runtime envelope
        assert run_job(job, "sh", "-c", "sleep 0.2").returncode == 0
        into_slot(back)
    for back, (what, _) in sorted(STRIP_PLAN.items(), reverse=True):
        command, more, code = COMMANDS[what]
        ran = run_job(job, *command, **more)
        assert ran.returncode == code, ran.stderr
        into_slot(back)
    for verb, back in (("pause", 22), ("resume", 19)):
        assert ctl(job, verb, key).returncode == 0
        # Just before the slot's start, so that it covers the slot 22 back to the one 20 back.
        db.execute(
            sql.SQL(
                "UPDATE {} SET started_at = %(at)s, ended_at = %(at)s"
                " WHERE lock_key = %(key)s AND outcome = %(outcome)s"
            ).format(history),
            {
                "key": key,
                "at": minute - timedelta(minutes=back, seconds=1),
                "outcome": f"{verb}d",
            },
        )
    started = tmp / "strip-running"
    running = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", f"touch {started}; exec sleep 300"],
        env={**job, "LOCK_STRATEGY": "schedule,lease", "RUN_LOCK_TTL_SECONDS": "30"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    wait_for(started)
    into_slot(3, let_go=False)
    return StripKey(key, minute, running)
