"""A slot held back by ``LOCK_AFTER``, as the history records it and ``dislockctl
missed`` tells it (issue #52): one event row per slot however many refusals, the
state ``held_back`` naming the key waited for, then ``done`` once it ran.

Real wrappers; a daily schedule, so that the slot cannot change within the test
(one that runs across midnight UTC waits for it to pass: ``clear_of_boundary``)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
from psycopg import sql

from tests.cli.conftest import Ctl, RunCli
from tests.support.clock import clear_of_boundary
from tests.support.rows import Rows

DAILY = "0 0 * * *"


def _history(env: dict[str, str]) -> sql.Identifier:
    schema, table = env["LOCK_TABLE"].split(".")
    return sql.Identifier(schema, f"{table}_history")


def _missed(ctl: Ctl, key: str, env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    found = ctl("missed", key, "--since", "25h", "--grace", "0", "--json", env=env)
    return found.returncode, json.loads(found.stdout)


def test_a_held_back_slot_is_recorded_once_and_told_apart_from_a_missed_one(
    ctl: Ctl,
    history_env: dict[str, str],
    run_cli: RunCli,
    db: psycopg.Connection[Any],
    rows: Rows,
) -> None:
    clear_of_boundary(rows, DAILY, 60)
    export = {
        **history_env,
        "LOCK_KEY": f"export-{uuid.uuid4().hex[:6]}",
        "CRON_SCHEDULE": DAILY,
        "CRON_TZ": "UTC",
        "CRONJOB_LOCK_LOG_LEVEL": "INFO",
    }
    report = {
        **export,
        "LOCK_KEY": f"report-{uuid.uuid4().hex[:6]}",
        "LOCK_AFTER": export["LOCK_KEY"],
    }
    for _ in range(2):
        refused = run_cli(["DATABASE_URL", "true"], report)
        assert refused.returncode == 0, refused.stderr
        assert "waits for" in refused.stderr
    recorded = db.execute(
        sql.SQL("SELECT outcome, owner, modes FROM {} WHERE lock_key = %s").format(
            _history(report)
        ),
        [report["LOCK_KEY"]],
    ).fetchall()
    assert recorded == [("held_back", f"waiting for {export['LOCK_KEY']}", "after")]

    status, found = _missed(ctl, report["LOCK_KEY"], report)
    # Held back until now: a slot that has not run is one to look at.
    assert status == 1
    (slot,) = found["states"]
    assert slot["state"] == "held_back" and slot["waiting_for"] == export["LOCK_KEY"]
    assert [missed["state"] for missed in found["missed"]] == ["held_back"]
    assert found["counts"]["held_back"] == 1 and found["counts"]["missed"] == 0
    assert found["runs"] == 0
    text = ctl("missed", report["LOCK_KEY"], "--since", "25h", "--grace", "0", env=report)
    assert f"held back (waiting for {export['LOCK_KEY']!r})" in text.stdout
    assert "1 held back" in text.stdout

    assert run_cli(["DATABASE_URL", "true"], export).returncode == 0
    ran = run_cli(["DATABASE_URL", "true"], report)
    assert ran.returncode == 0, ran.stderr
    status, found = _missed(ctl, report["LOCK_KEY"], report)
    assert status == 0, found
    assert [slot["state"] for slot in found["states"]] == ["done"]
    assert found["runs"] == 1
    # The history lists the event apart from the run.
    listed = json.loads(ctl("history", report["LOCK_KEY"], "--json", env=report).stdout)
    assert sorted(run["outcome"] for run in listed) == ["held_back", "ok"]
