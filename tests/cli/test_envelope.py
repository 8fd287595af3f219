"""A key's runtime envelope from real runs: ``history`` marks a slow and a short run,
``check`` shows the envelope once ten runs succeeded, ``serve`` flags a run still
going past it; and which rows the envelope is learned from."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from dislock.cli.runs.envelope import successes_before
from dislock.cli.sending import send
from tests.cli.conftest import Ctl, RunCli, holding
from tests.cli.serving import run_job, sample, serving
from tests.support.eventually import eventually

LEASE = {"LOCK_STRATEGY": "lease"}


def durations(ctl: Ctl, key: str) -> list[float]:
    return [run["duration_seconds"] for run in json.loads(ctl("history", key, "--json").stdout)]


def test_a_slow_and_a_short_run_are_marked(
    ctl: Ctl, cli_env: dict[str, str], run_cli: RunCli
) -> None:
    assert ctl("init", "--history").returncode == 0
    env = {**cli_env, **LEASE, "LOCK_HISTORY": "1"}
    key = env["LOCK_KEY"]
    for _ in range(9):
        assert run_cli(["DATABASE_URL", "sleep", "0.6"], env).returncode == 0
    assert "runtime" not in ctl("check", env=env).stdout  # nine successes: too few
    assert run_cli(["DATABASE_URL", "sleep", "0.6"], env).returncode == 0
    usual = sorted(durations(ctl, key))
    median = (usual[4] + usual[5]) / 2
    checked = ctl("check", env=env).stdout
    assert f"runtime         median {median:.1f}s, longest {usual[-1]:.1f}s" in checked, checked
    assert "of the last 10 successful runs" in checked

    # Past 3 x the median and past the longest by a clear margin, whatever the machine's pace.
    slow = f"{max(3 * median, usual[-1]) + 0.5:.2f}"
    assert run_cli(["DATABASE_URL", "sleep", slow], env).returncode == 0
    assert run_cli(["DATABASE_URL", "true"], env).returncode == 0

    runs = json.loads(ctl("history", key, "--json").stdout)
    assert [run["envelope"] for run in runs] == ["short", "slow"] + [None] * 10
    table = ctl("history", key).stdout.splitlines()
    assert table[1].endswith("ok, short") and table[2].endswith("ok, slow"), table
    assert all(line.endswith("ok") for line in table[3:13])
    assert table[-1].startswith("slow: longer than 3 x the median")


def test_the_envelope_is_learned_from_the_keys_earlier_successes_only(
    history_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    schema, table = history_env["LOCK_TABLE"].split(".")
    history = (schema, f"{table}_history")
    key = history_env["LOCK_KEY"]
    insert = sql.SQL(
        "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at, ended_at, outcome)"
        " SELECT %s, 'lease', 'o', 'h', 1, t, t + make_interval(secs => %s), %s"
        " FROM (SELECT NOW() - make_interval(mins => %s) AS t) AS at RETURNING started_at"
    ).format(sql.Identifier(*history))

    def recorded(minutes_ago: int, seconds: float, outcome: str = "ok", of: str = key) -> datetime:
        row = db.execute(insert, (of, seconds, outcome, minutes_ago)).fetchone()
        assert row is not None
        started: datetime = row[0]
        return started

    for minute in range(100, 91, -1):  # nine successes of 1 s, then the tenth
        recorded(minute, 1.0)
    tenth = recorded(91, 1.0)
    for minute in range(80, 60, -1):  # failures, another key's runs, later successes
        recorded(minute, 50.0, "failed")
        recorded(minute, 50.0, of=f"{key}-other")
    recorded(30, 7.0)

    def envelope_before(before: datetime | None) -> tuple[float, float, int] | None:
        (found,) = send(db, successes_before(history, [(key, before)]))
        return None if found is None else (found.median, found.longest, found.runs)

    assert envelope_before(tenth) is None  # nine successes before it
    assert envelope_before(recorded(85, 1.0, "failed")) == (1.0, 1.0, 10)
    assert envelope_before(None) == (1.0, 7.0, 11)


def test_serve_flags_a_run_still_going_past_its_envelope(
    history_env: dict[str, str], db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    schema, table = history_env["LOCK_TABLE"].split(".")
    key = history_env["LOCK_KEY"]
    db.execute(
        sql.SQL(
            "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at, ended_at, outcome)"
            " SELECT %s, 'lease', 'o', 'h', 1, t, t + interval '10 ms', 'ok' FROM"
            " generate_series(NOW() - interval '1 hour', NOW() - interval '10 min', '5 min') AS t"
        ).format(sql.Identifier(schema, f"{table}_history")),
        (key,),
    )
    env = {**history_env, **LEASE}
    assert run_job(env, "true").returncode == 0  # its lease row lists the key
    with serving(env) as served:
        assert sample(served.metrics(), "dislock_running_past_envelope", key=key) == 0.0
        with holding(env, tmp_path):
            eventually(
                lambda: sample(served.metrics(), "dislock_running_past_envelope", key=key) == 1.0,
                interval=0.2,
                message="the run past its envelope was not flagged",
            )
            page = served.get("/")[2]
            assert 'data-envelope="slow"' in page and "running past its envelope" in page
