"""What became of each slot, as ``dislockctl missed``, ``serve``'s metrics and its page
tell it: done, failed, retrying, paused and missed apart.

Runs are real wrappers and pauses real ``dislockctl pause``/``resume`` commands,
except in the serve test, where the runs and events of the last ten minutes are
written as the wrappers and commands write them, their starts placed in minutes
gone by (serve judges only slots that began a minute ago or more).
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from dislock.core.cron import next_boundary
from dislock.core.rows import schedule_key
from tests.cli.conftest import Ctl, RunCli
from tests.cli.serving import sample, serving
from tests.support.clock import clear_of_boundary
from tests.support.hosts import on_host
from tests.support.rows import Rows

EVERY_MINUTE = "* * * * *"
EVERY_SECOND = "* * * * * *"
HOURLY = "0 * * * *"


def history(env: dict[str, str]) -> sql.Identifier:
    schema, table = env["LOCK_TABLE"].split(".")
    return sql.Identifier(schema, f"{table}_history")


def states(report: dict[str, Any]) -> list[tuple[datetime, str, int]]:
    return [
        (datetime.fromisoformat(slot["slot_start"]), slot["state"], slot["attempts"])
        for slot in report["states"]
    ]


def test_a_paused_slot_is_not_missed_and_a_slot_after_the_resume_is(
    ctl: Ctl, history_env: dict[str, str], run_cli: RunCli
) -> None:
    env = {**history_env, "LOCK_STRATEGY": "schedule", "CRON_SCHEDULE": EVERY_SECOND}
    key = env["LOCK_KEY"]
    assert run_cli(["DATABASE_URL", "true"], env).returncode == 0
    paused = ctl("pause", key, "--reason", "disk swap", env=env)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.rstrip().endswith("; recorded in " + ".".join(history_parts(env)))
    time.sleep(3)
    resumed = ctl("resume", key, env=env)
    assert resumed.returncode == 0 and "; recorded in " in resumed.stdout, resumed.stderr
    time.sleep(2.5)

    found = ctl("missed", key, "--since", "2m", "--grace", "0", "--json", env=env)
    # The slots after the resume had no start: missed, exit 1.
    assert found.returncode == 1, found.stderr
    report = json.loads(found.stdout)
    events = json.loads(ctl("history", key, "--json", env=env).stdout)
    (pause,) = [event for event in events if event["outcome"] == "paused"]
    (resume,) = [event for event in events if event["outcome"] == "resumed"]
    assert pause["owner"].endswith(": disk swap") and pause["owner"].startswith("pause by ")
    began, ended = (datetime.fromisoformat(e["started_at"]) for e in (pause, resume))
    judged = states(report)
    assert judged[0][1:] == ("done", 1)
    # Every slot that began while the pause was in force reads paused, and only those.
    for start, state, attempts in judged[1:]:
        assert state == ("paused" if began <= start < ended else "missed"), (start, judged)
        assert attempts == 0
    counts = report["counts"]
    assert counts["paused"] >= 2 and counts["missed"] >= 2, counts
    assert [slot["state"] for slot in report["missed"]] == ["missed"] * counts["missed"]
    # The text lists what to look at, --all every slot.
    text = ctl("missed", key, "--since", "2m", "--grace", "0", env=env).stdout
    assert "paused" not in text.splitlines()[1] and "  missed  0" in text
    assert " paused; paused: a dislockctl pause was in force as the slot began" in text
    every = ctl("missed", key, "--since", "2m", "--grace", "0", "--all", env=env).stdout
    assert "  done    1" in every and "  paused  0" in every
    # The history tells the pause with its end and no duration.
    listed = ctl("history", key, env=env).stdout
    assert "paused until resumed" in listed and "resumed" in listed.splitlines()[1]


def history_parts(env: dict[str, str]) -> tuple[str, str]:
    schema, table = env["LOCK_TABLE"].split(".")
    return schema, f"{table}_history"


def test_a_slot_whose_attempts_all_failed_and_one_waiting_for_its_retry(
    ctl: Ctl, history_env: dict[str, str], run_cli: RunCli, db: psycopg.Connection[Any], rows: Rows
) -> None:
    env = {**history_env, "LOCK_STRATEGY": "schedule", "CRON_SCHEDULE": EVERY_MINUTE}
    key = env["LOCK_KEY"]
    clear_of_boundary(rows, EVERY_MINUTE, seconds=25)
    # Last minute's slot: two attempts (one retry asked for), both failed; a third
    # wrapper finds the slot's attempts used up.
    once_more = {**env, "LOCK_RETRIES": "1", "LOCK_RETRY_DELAY_SECONDS": "1"}
    assert run_cli(["DATABASE_URL", "false"], once_more).returncode == 1
    time.sleep(1.5)
    # (On another machine: this one leaves the retry to others for a grace.)
    second = run_cli(
        ["DATABASE_URL", "sh", "-c", 'echo "$DISLOCK_ATTEMPT"; false'], on_host(once_more, "b")
    )
    assert second.returncode == 1 and second.stdout == "2\n", second
    assert run_cli(["DATABASE_URL", "false"], once_more).returncode == 0
    db.execute(
        sql.SQL(
            "UPDATE {} SET started_at = started_at - interval '1 minute',"
            " ended_at = ended_at - interval '1 minute', slot_end = slot_end - interval '1 minute'"
            " WHERE lock_key = %s"
        ).format(history(env)),
        (key,),
    )
    # This minute's (the slot row the run above took is let go, as the next minute
    # would have): failed, and a retry is due later in the slot.
    db.execute(
        sql.SQL("DELETE FROM {} WHERE key = %s").format(
            sql.Identifier(*env["LOCK_TABLE"].split("."))
        ),
        (schedule_key(key),),
    )
    retrying = {**env, "LOCK_RETRIES": "2", "LOCK_RETRY_DELAY_SECONDS": "5"}
    assert run_cli(["DATABASE_URL", "false"], retrying).returncode == 1

    found = ctl("missed", key, "--since", "3m", "--grace", "0", "--json", env=env)
    assert found.returncode == 1, found.stderr
    report = json.loads(found.stdout)
    assert [state[1:] for state in states(report)] == [("failed", 2), ("retrying", 1)]
    assert [slot["state"] for slot in report["missed"]] == ["failed"]
    text = ctl("missed", key, "--since", "3m", "--grace", "0", env=env).stdout
    assert "were missed, late or failed for" in text and "(1 failed); 1 retrying" in text
    # The history numbers each run's attempt at its slot, newest first.
    runs = json.loads(ctl("history", key, "--json", env=env).stdout)
    assert [run["attempt"] for run in runs] == [1, 2, 1], runs
    assert "failed (1), attempt 2" in ctl("history", key, env=env).stdout


def test_serve_counts_failed_and_paused_slots_apart_from_missed(
    ctl: Ctl, history_env: dict[str, str], run_cli: RunCli, db: psycopg.Connection[Any], rows: Rows
) -> None:
    env = {**history_env, "LOCK_STRATEGY": "schedule", "CRON_SCHEDULE": EVERY_MINUTE}
    key = env["LOCK_KEY"]
    assert run_cli(["DATABASE_URL", "true"], env).returncode == 0
    clear_of_boundary(rows, EVERY_MINUTE, seconds=25)
    table = history(env)
    minute = "date_trunc('minute', NOW()) - interval '{} minutes'"
    # The run: ten minutes ago, done.  A pause from just before the slot of 8
    # minutes ago to just before that of 5 (three slots), a failed run 4 minutes
    # ago; nothing else: 9, 5, 3, 2 and 1 minutes ago were missed.
    at = {f"m{n}": sql.SQL(minute.format(n)) for n in (3, 4, 5, 8, 9, 10)}
    params = {"key": key, "cron": EVERY_MINUTE}
    db.execute(
        sql.SQL(
            "UPDATE {t} SET started_at = {m10} + interval '1 second',"
            " ended_at = {m10} + interval '2 seconds', slot_end = {m9} WHERE lock_key = %(key)s"
        ).format(t=table, **at),
        params,
    )
    db.execute(
        sql.SQL(
            "INSERT INTO {t} (lock_key, modes, slot_end, owner, host, pid, started_at, ended_at,"
            " outcome) VALUES (%(key)s, 'pause', {m5} - interval '1 second', 'pause by test',"
            " 'here', 1, {m8} - interval '1 second', {m8} - interval '1 second', 'paused')"
        ).format(t=table, **at),
        params,
    )
    db.execute(
        sql.SQL(
            "INSERT INTO {t} (lock_key, modes, slot_end, owner, host, pid, started_at, ended_at,"
            " outcome, exit_code, cron) VALUES (%(key)s, 'schedule', {m3}, 'w:1:ab', 'here', 1,"
            " {m4} + interval '1 second', {m4} + interval '2 seconds', 'failed', 1, %(cron)s)"
        ).format(t=table, **at),
        params,
    )
    found = ctl("missed", key, "--since", "11m", "--json", env=env)
    assert found.returncode == 1, found.stderr
    assert [state[1] for state in states(json.loads(found.stdout))] == [
        "done",
        "missed",
        "paused",
        "paused",
        "paused",
        "missed",
        "failed",
        "missed",
        "missed",
        "missed",
    ]
    with serving(env) as served:
        metrics = served.metrics()
        page = served.get("/")[2]
    assert sample(metrics, "dislock_missed_slots", key=key) == 5.0
    assert sample(metrics, "dislock_paused_slots", key=key) == 3.0
    assert sample(metrics, "dislock_failed_slots", key=key) == 1.0
    assert sample(metrics, "dislock_late_slots", key=key) == 0.0
    # The pause is no run: the key's latest run is the failed one.
    assert sample(metrics, "dislock_runs_total", key=key, outcome="failed") == 1.0
    assert sample(metrics, "dislock_runs_total", key=key, outcome="ok") == 1.0
    row = page[page.index(f'data-key="{key}"') :].split("</tr>", 1)[0]
    assert 'data-outcome="failed"' in row and 'data-failed="1"' in row, row
    assert "1 failed (every attempt)" in row and "3 paused" in row, row


def test_a_rerun_slot_is_judged_by_the_run_after_the_rerun(
    ctl: Ctl, history_env: dict[str, str], run_cli: RunCli, rows: Rows
) -> None:
    env = {**history_env, "LOCK_STRATEGY": "schedule", "CRON_SCHEDULE": EVERY_MINUTE}
    key = env["LOCK_KEY"]
    clear_of_boundary(rows, EVERY_MINUTE, seconds=25)
    assert run_cli(["DATABASE_URL", "true"], env).returncode == 0
    done = json.loads(ctl("missed", key, "--since", "2m", "--grace", "0", "--json", env=env).stdout)
    assert [state[1:] for state in states(done)] == [("done", 1)]
    # Less than a minute is left of an every-minute slot: --force.
    rerun = ctl("rerun", key, "--reason", "bucket fixed", "--force", env=env)
    assert rerun.returncode == 0, rerun.stderr
    waiting = json.loads(
        ctl("missed", key, "--since", "2m", "--grace", "0", "--json", env=env).stdout
    )
    assert [state[1:] for state in states(waiting)] == [("retrying", 0)]
    assert run_cli(["DATABASE_URL", "false"], env).returncode == 1
    found = ctl("missed", key, "--since", "2m", "--grace", "0", "--json", env=env)
    # The success before the rerun does not hide the failure after it.
    assert found.returncode == 1, found.stdout
    assert [state[1:] for state in states(json.loads(found.stdout))] == [("failed", 1)]


def test_missed_and_serve_agree_about_a_slot_reopened_and_not_run_again_yet(
    ctl: Ctl, history_env: dict[str, str], db: psycopg.Connection[Any], rows: Rows
) -> None:
    """An hourly slot done, then reopened by a rerun, with no run after it yet: as
    ``dislockctl rerun`` and the wrapper leave the rows.  Both say retrying, not missed
    (serve reads the rerun's event, missed the row it reopened)."""
    env = {**history_env, "LOCK_STRATEGY": "schedule", "CRON_SCHEDULE": HOURLY}
    key = env["LOCK_KEY"]
    while True:  # a slot that began over a minute ago (serve judges it) and is not over
        now = rows.now()
        began, ends = now.replace(minute=0, second=0, microsecond=0), next_boundary(HOURLY, now)
        if (now - began).total_seconds() >= 70 and (ends - now).total_seconds() >= 60:
            break
        time.sleep(5)
    rows.plant(schedule_key(key), "w:1:ab", 1)
    db.execute(
        sql.SQL(
            "INSERT INTO {t} (lock_key, modes, slot_end, owner, host, pid, started_at, ended_at,"
            " outcome, cron) VALUES (%(key)s, 'schedule', %(end)s, 'w:1:ab', 'here', 1,"
            " %(began)s + interval '1 second', %(began)s + interval '2 seconds', 'ok', %(cron)s),"
            " (%(key)s, 'rerun', %(end)s, 'rerun by test', 'here', 1, NOW(), NOW(), 'rerun', NULL)"
        ).format(t=history(env)),
        {"key": key, "cron": HOURLY, "began": began, "end": ends},
    )
    db.execute(
        sql.SQL("UPDATE {t} SET value = %s, expire_at = NOW() WHERE key = %s").format(
            t=sql.Identifier(*env["LOCK_TABLE"].split("."))
        ),
        (
            f"rerun by test (attempt 0) (failed; retry in slot {int(ends.timestamp())})",
            schedule_key(key),
        ),
    )
    found = ctl("missed", key, "--since", "2h", "--json", env=env)
    assert found.returncode == 0, found.stdout
    report = json.loads(found.stdout)
    assert [state[1:] for state in states(report)] == [("retrying", 0)]
    with serving(env) as served:
        metrics = served.metrics()
    assert sample(metrics, "dislock_missed_slots", key=key) == report["counts"]["missed"] == 0


def test_pruning_keeps_a_pause_still_in_force(
    ctl: Ctl, history_env: dict[str, str], run_cli: RunCli, db: psycopg.Connection[Any]
) -> None:
    env = {**history_env, "LOCK_STRATEGY": "lease"}
    key = env["LOCK_KEY"]
    assert run_cli(["DATABASE_URL", "true"], env).returncode == 0
    assert ctl("pause", key, env=env).returncode == 0
    aged = sql.SQL(
        "UPDATE {} SET started_at = started_at - interval '40 days',"
        " ended_at = ended_at - interval '40 days' WHERE lock_key = %s"
    ).format(history(env))
    db.execute(aged, (key,))
    pruned = ctl("history", "--prune-older-than", "30d", env=env)
    assert pruned.stdout.startswith("deleted 1 run(s)"), pruned.stdout  # the run, not the pause
    left = json.loads(ctl("history", key, "--since", "60d", "--json", env=env).stdout)
    assert [run["outcome"] for run in left] == ["paused"]
    # Once resumed (and that long ago too), the pause goes with the rest.
    assert ctl("resume", key, env=env).returncode == 0
    db.execute(aged, (key,))
    again = ctl("history", "--prune-older-than", "30d", env=env)
    assert again.stdout.startswith("deleted 2 run(s)"), again.stdout
