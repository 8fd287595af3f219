"""A lease job that outlasts its interval: the slots its run covered are not missed.

The next minute's wrappers skip because the lease is held, which is the lock
working; ``dislockctl missed``, ``serve``'s metrics and its page report those
slots as covered and exit 0 / count no miss, while a run that died (abandoned) or
a schedule-only run covers nothing.  Runs are real wrappers; only their start is
moved back in time, the way the clock would have moved on.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock.core.rows import lease_key
from tests.cli.conftest import Ctl, RunCli, holding
from tests.cli.serving import sample, serving
from tests.support.clock import clear_of_boundary
from tests.support.rows import Rows

EVERY_MINUTE = "* * * * *"


@pytest.fixture
def long_job(
    history_env: dict[str, str], tmp_path: Path
) -> Iterator[tuple[dict[str, str], subprocess.Popen[bytes]]]:
    """A lease job with a minute schedule whose command runs for ten minutes."""
    env = {
        **history_env,
        "LOCK_STRATEGY": "lease",
        "CRON_SCHEDULE": EVERY_MINUTE,
        "RUN_LOCK_TTL_SECONDS": "30",
        "LOCK_LEASE_INTERVAL": "1",
    }
    with holding(env, tmp_path) as holder:
        yield env, holder


def history(env: dict[str, str]) -> sql.Identifier:
    schema, table = env["LOCK_TABLE"].split(".")
    return sql.Identifier(schema, f"{table}_history")


def move_start(db: psycopg.Connection[Any], env: dict[str, str], interval: str) -> None:
    """The key's run started ``interval`` before the current minute began."""
    db.execute(
        sql.SQL(
            "UPDATE {} SET started_at = date_trunc('minute', NOW()) - %s::interval"
            " + interval '10 seconds' WHERE lock_key = %s"
        ).format(history(env)),
        (interval, env["LOCK_KEY"]),
    )


def nobody(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The slots of a ``missed --json`` report nobody started."""
    return [slot for slot in report["missed"] if slot["state"] == "missed"]


def report(ctl: Ctl, env: dict[str, str], *args: str) -> tuple[int, dict[str, Any]]:
    result = ctl("missed", env["LOCK_KEY"], "--grace", "0", "--json", *args, env=env)
    return result.returncode, json.loads(result.stdout)


def test_slots_a_running_lease_covered_are_not_missed(
    long_job: tuple[dict[str, str], subprocess.Popen[bytes]],
    ctl: Ctl,
    run_cli: RunCli,
    db: psycopg.Connection[Any],
    rows: Rows,
) -> None:
    env, holder = long_job
    key = env["LOCK_KEY"]
    # The next minute's wrapper skips: the lease is held.
    skipped = run_cli(["DATABASE_URL", "touch", "/nonexistent/never"], env)
    assert skipped.returncode == 0, skipped.stderr
    # Slots from 4 minutes ago: the reports below come well within the minute.
    clear_of_boundary(rows, EVERY_MINUTE, seconds=25)
    move_start(db, env, "4 minutes")

    status, found = report(ctl, env, "--since", "10m")
    assert status == 0, found
    assert found["missed"] == [] and found["runs"] == 1
    # The run's own slot had its start; every later one was covered.
    assert found["slots"] >= 5 and len(found["covered"]) == found["slots"] - 1
    text = ctl("missed", key, "--since", "10m", "--grace", "0", env=env)
    assert text.returncode == 0, text.stderr
    # (Read again: a minute may have begun since.)
    said = re.search(r"0 of (\d+) slot\(s\).*; 1 running, (\d+) covered; covered: ", text.stdout)
    assert said is not None, text.stdout
    assert int(said.group(2)) == int(said.group(1)) - 1

    # A window that begins while the run goes: every slot of it is covered.
    status, inside = report(ctl, env, "--since", "2m")
    assert status == 0 and inside["runs"] == 0 and inside["missed"] == []
    assert inside["slots"] >= 2 and len(inside["covered"]) == inside["slots"]

    with serving(env) as served:
        metrics = served.metrics()
        page = served.get("/")[2]
    assert sample(metrics, "dislock_missed_slots", key=key) == 0.0
    covered = sample(metrics, "dislock_covered_slots", key=key)
    assert covered is not None and covered >= 3  # the window's grace leaves out the last
    row = page[page.index(f'data-key="{key}"') :].split("</tr>", 1)[0]
    assert 'data-missed="0"' in row and "covered by a run still going" in row
    shown = int(row.split('data-covered="', 1)[1].split('"', 1)[0])
    assert shown >= covered  # (a minute may have begun between the two reads)

    # Control: the same span without a lease (a schedule lock alone lets the next
    # slot start) covers nothing.
    db.execute(sql.SQL("UPDATE {} SET modes = 'schedule'").format(history(env)))
    status, schedule_only = report(ctl, env, "--since", "10m")
    assert status == 1 and schedule_only["covered"] == []
    # (The run's own slot is failed: its lease-only row holds no slot row, so a
    # schedule run without an end reads as abandoned.)
    assert len(nobody(schedule_only)) == schedule_only["slots"] - 1
    db.execute(sql.SQL("UPDATE {} SET modes = 'lease'").format(history(env)))

    # The machine dies: no end is recorded and the lease runs out.  When it ran out
    # is not known, so the abandoned run covers nothing.
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    rows.expire(lease_key(key))
    status, abandoned = report(ctl, env, "--since", "10m")
    assert status == 1 and abandoned["covered"] == []
    assert len(nobody(abandoned)) == abandoned["slots"] - 1

    # A run that ended 2m20s after its start (10 s into its minute) covered the two
    # slots after its own; the later ones were missed.  (Relative to its start: a
    # minute may well have begun since it was moved.)
    db.execute(
        sql.SQL(
            "UPDATE {} SET ended_at = started_at + interval '140 seconds',"
            " outcome = 'ok', exit_code = 0"
        ).format(history(env))
    )
    status, ended = report(ctl, env, "--since", "10m")
    assert status == 1, ended
    assert len(ended["covered"]) == 2 and len(ended["missed"]) == ended["slots"] - 3
    assert max(s["slot_end"] for s in ended["covered"]) == min(
        s["slot_start"] for s in ended["missed"]
    )


def test_a_run_going_since_before_the_window_covers_it_in_serve(
    long_job: tuple[dict[str, str], subprocess.Popen[bytes]],
    db: psycopg.Connection[Any],
) -> None:
    """``serve`` judges 24 hours: a run begun 25 hours ago and still going covers them."""
    env, _ = long_job
    key = env["LOCK_KEY"]
    move_start(db, env, "25 hours")
    with serving(env) as served:
        metrics = served.metrics()
    assert sample(metrics, "dislock_missed_slots", key=key) == 0.0
    covered = sample(metrics, "dislock_covered_slots", key=key)
    assert covered is not None and covered >= 24 * 60 - 2
