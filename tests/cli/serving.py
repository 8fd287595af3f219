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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from dislock.core.pause import pausing
from dislock.core.rows import lease_key
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
