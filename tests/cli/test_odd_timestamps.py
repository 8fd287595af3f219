"""Non-finite and far-off timestamps break no reader (security review #61, N6): one
``infinity`` in a lock row's ``expire_at`` or a run's ``started_at``, written by the
table's owner, had made ``ls``, ``history`` and ``missed`` exit 1 and ``serve`` report
``dislock_up 0`` (psycopg refuses to load a timestamp past year 9999).  Such a row is
shown (``infinity``, a date) and the views go on.  That the lock functions store no
such expiry: ``security/test_endless_rows.py``."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.cli.conftest import Ctl, RunCli
from tests.cli.serving import serving

ODD = ["infinity", "-infinity", "294276-01-01 00:00:00+00", "9999-12-30 00:00:00+00"]
"""Timestamps psycopg cannot load or Python cannot add to."""


def _write_odd_rows(db: psycopg.Connection[Any], env: dict[str, str]) -> str:
    """As the tables' owner: a lease, a slot and a pause of each odd expiry, and a run
    of each odd start (and end, and slot end) beside one ordinary run; the key."""
    key = env["LOCK_KEY"]
    schema, name = env["LOCK_TABLE"].split(".")
    for n, odd in enumerate(ODD):
        db.execute(
            sql.SQL(
                "INSERT INTO {} VALUES (%(lease)s, 'host:1:abcd', %(odd)s),"
                " (%(slot)s, 'host:2:abcd', %(odd)s), (%(pause)s, 'why', %(odd)s)"
            ).format(sql.Identifier(schema, name)),
            {
                "lease": f"cronjob-lock:lease:{key}-{n}",
                "slot": f"cronjob-lock:schedule:{key}-{n}",
                "pause": f"cronjob-lock:pause:{key}-{n}",
                "odd": odd,
            },
        )
        db.execute(
            sql.SQL(
                "INSERT INTO {} (lock_key, modes, slot_end, owner, host, pid, started_at,"
                " ended_at, outcome, exit_code, cron, cron_tz) VALUES"
                " (%(key)s, 'schedule', %(odd)s, 'o', 'h', 1, %(odd)s, %(odd)s, 'failed', 1,"
                " '* * * * *', 'UTC'),"
                " (%(other)s, 'schedule', %(odd)s, 'o', 'h', 1, NOW() - interval '1 minute',"
                " %(odd)s, 'ok', 0, '* * * * *', 'UTC')"
            ).format(sql.Identifier(schema, f"{name}_history")),
            {"key": key, "other": f"{key}-{n}", "odd": odd},
        )
    db.execute(
        sql.SQL(
            "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at, ended_at, outcome,"
            " exit_code, cron, cron_tz) VALUES (%(key)s, 'schedule', 'o', 'plain-host', 1,"
            " NOW() - interval '2 minutes', NOW() - interval '1 minute', 'ok', 0,"
            " '* * * * *', 'UTC')"
        ).format(sql.Identifier(schema, f"{name}_history")),
        {"key": key},
    )
    return key


def test_every_view_shows_odd_timestamps_and_goes_on(
    ctl: Ctl, history_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    key = _write_odd_rows(db, history_env)
    listed = ctl("ls", env=history_env)
    assert listed.returncode == 0, listed.stderr
    assert "infinity" in listed.stdout and "maximum lease TTL" in listed.stdout
    for n in range(len(ODD)):
        assert f"{key}-{n}" in listed.stdout
    rows = json.loads(ctl("ls", "--json", env=history_env).stdout)
    # Every row but the pause that ended at -infinity (an ended pause is not listed).
    assert len([row for row in rows if row["lock_key"].startswith(key)]) == 3 * len(ODD) - 1

    shown = ctl("history", key, env=history_env)
    assert shown.returncode == 0, shown.stderr
    assert "plain-host" in shown.stdout and "infinity" in shown.stdout
    runs = json.loads(ctl("history", "--json", env=history_env).stdout)
    # Every run but the one that started at -infinity (before any window asked for).
    assert len(runs) == 2 * len(ODD) and {"infinity", "-infinity"} <= {
        run["slot_end"] for run in runs
    }

    # `missed` exits 1 for slots to look at, 0 for none, listed on stdout; a failed read
    # is a line on stderr.
    for args in (["missed", key], ["missed", f"{key}-0"], ["missed", key, "--json"], ["history"]):
        result = ctl(*args, env=history_env)
        assert result.stderr == "" and result.returncode in (0, 1) and result.stdout, args
    assert f"were missed, late or failed for {key!r}" in ctl("missed", key, env=history_env).stdout

    with serving(history_env) as served:
        metrics = served.metrics()
        assert metrics[("dislock_up", ())] == 1.0
        status, _, page = served.get("/")
        assert status == 200 and "did not answer" not in page and key in page
    assert "did not answer" not in "".join(served.log), served.log


@pytest.mark.parametrize("strategy", ["schedule", "lease"])
def test_a_pause_written_infinity_is_one_until_resumed(
    cli_env: dict[str, str], db: psycopg.Connection[Any], run_cli: RunCli, strategy: str
) -> None:
    """The lock functions (and the plain statements) answer a pause's end: one written
    ``'infinity'`` by hand had made every run of its key fail on loading it."""
    schema, name = cli_env["LOCK_TABLE"].split(".")
    db.execute(
        sql.SQL("INSERT INTO {} VALUES (%s, 'by hand', 'infinity')").format(
            sql.Identifier(schema, name)
        ),
        (f"cronjob-lock:pause:{cli_env['LOCK_KEY']}",),
    )
    result = run_cli(
        ["DATABASE_URL", "echo", "ran"],
        {**cli_env, "LOCK_STRATEGY": strategy, "CRONJOB_LOCK_LOG_LEVEL": "INFO"},
    )
    assert result.returncode == 0 and "ran" not in result.stdout, result
    assert "paused until resumed: by hand" in result.stderr, result.stderr
