"""The audit trail and ``retire`` as the table's owner: the docs' blocks as pasted, a
retired key gone from ``missed``, ``ls`` and ``serve``, every action's row, and a table
without the trail (its operator commands work; ``audit`` says to run ``init``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import psycopg

from tests.cli.conftest import CTL, Ctl, dislock_on_path, run_pasted
from tests.cli.serving import run_job, serving


def _trail(ctl: Ctl, *args: str) -> list[dict[str, Any]]:
    result = ctl("audit", "--json", *args)
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def test_the_docs_audit_example_runs_as_printed(
    cli_env: dict[str, str], ctl: Ctl, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    assert ctl("init").returncode == 0
    role = db.execute("SELECT session_user").fetchone()
    assert role is not None
    env = {**cli_env, "PATH": dislock_on_path(tmp_path)}
    result = run_pasted("operator.md", "## Audit trail: `audit`", env)
    assert result.returncode == 0, result.stderr
    paused, audited = result.stdout.splitlines()
    assert paused.startswith("paused 'nightly' until resumed (disk full)"), paused
    # As the docs print it, but for the time and the role (here the login role alone).
    shown = (Path(__file__).parents[2] / "docs" / "operator.md").read_text()
    printed = re.search(r"```text\n(\S+ \S+ UTC  pause  nightly  by .*)\n```", shown)
    assert printed is not None
    expected = re.sub(r"by alice as ops", f"by {role[0]}", printed.group(1))
    assert audited[len("2026-12-07 23:30:01") :] == expected[len("2026-12-07 23:30:01") :]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", audited[:19]), audited


def test_a_retired_key_is_gone_from_missed_ls_and_metrics(
    cli_env: dict[str, str], ctl: Ctl, tmp_path: Path
) -> None:
    """The docs' block as pasted: a key run once by hand with CRON_SCHEDULE."""
    assert ctl("init", "--history").returncode == 0
    key = "nightly-by-hand"
    env = {**cli_env, "LOCK_KEY": key, "CRON_SCHEDULE": "* * * * *", "LOCK_HISTORY": "1"}
    assert run_job(env, "true").returncode == 0
    assert ctl("missed", key, "--all").returncode in (0, 1)
    assert key in ctl("ls").stdout
    with serving(cli_env) as served:
        assert any(dict(labels).get("key") == key for _, labels in served.metrics())
    pasted = {**cli_env, "PATH": dislock_on_path(tmp_path)}
    result = run_pasted("operator.md", "## `retire`", pasted)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"retired {key!r}: deleted 1 lock row(s) and 1 recorded run(s)")
    gone = ctl("missed", key)
    assert gone.returncode == 1 and "no run of 'nightly-by-hand' is recorded" in gone.stderr
    assert key not in ctl("ls").stdout
    with serving(cli_env) as served:
        assert not any(dict(labels).get("key") == key for _, labels in served.metrics())
    (row,) = _trail(ctl, "--key", key)
    assert (row["action"], row["reason"]) == ("retire", "run once by hand")
    assert row["detail"] == "1 lock row(s), 1 run(s)"
    again = ctl("retire", key)
    assert again.returncode == 1 and "nothing to retire" in again.stderr


def test_a_held_key_is_not_retired(cli_env: dict[str, str], ctl: Ctl) -> None:
    assert ctl("init").returncode == 0
    key = cli_env["LOCK_KEY"]
    holder = {**cli_env, "LOCK_STRATEGY": "lease", "CRON_SCHEDULE": ""}
    # Run by the wrapper that holds the key's lease: retire refuses from inside it.
    inside = run_job(holder, *CTL, "DATABASE_URL", "retire", key)
    assert inside.returncode == 1, inside.stderr
    assert "is held" in inside.stderr, inside.stderr
    assert key in ctl("ls").stdout and _trail(ctl, "--key", key) == []


def test_every_owner_action_is_audited_with_its_reason(
    cli_env: dict[str, str], ctl: Ctl, db: psycopg.Connection[Any]
) -> None:
    assert ctl("init", "--fencing", "--reason", "first").returncode == 0
    key, schema = cli_env["LOCK_KEY"], cli_env["LOCK_TABLE"].split(".")[0]
    assert run_job({**cli_env, "LOCK_STRATEGY": "schedule"}, "true").returncode == 0
    db.execute(f'CREATE TABLE "{schema}".accounts (id int)')
    steps = [
        ("pause", key, "--for", "1h"),
        ("resume", key),
        ("rerun", key),
        ("fence", f"{schema}.accounts", "--key", key),
        ("unfence", f"{schema}.accounts"),
        ("release", key),  # the lease a machine holds (written just before)
        ("retire", key),
    ]
    for step in steps:
        if step[0] == "release":
            db.execute(
                f"INSERT INTO \"{schema}\".key_value VALUES (%s, %s, now() + interval '1 hour')",
                (f"cronjob-lock:lease:{key}", "web-1:1:token"),
            )
        result = ctl(*step, "--reason", f"why {step[0]}")
        assert result.returncode == 0, (step, result.stdout, result.stderr)
    rows = _trail(ctl)
    done = [(row["action"], row["lock_key"], row["reason"]) for row in rows]
    assert done[0] == ("init", None, "first")
    assert ("pause", key, "why pause") in done and ("resume", key, "why resume") in done
    assert ("rerun", key, "why rerun") in done and ("retire", key, "why retire") in done
    assert ("release", key, "why release") in done
    assert ("fence", key, "why fence") in done and ("unfence", key, "why unfence") in done
    assert [row["at"] for row in rows] == sorted(row["at"] for row in rows)
    (login,) = db.execute("SELECT session_user").fetchone() or ("",)
    assert {(row["login_role"], row["acted_as"]) for row in rows} == {(login, login)}
    too_long = ctl("pause", key, "--reason", "x" * 1001)
    assert too_long.returncode == 2 and len(_trail(ctl)) == len(rows)


def test_a_table_without_the_trail_is_not_audited(cli_env: dict[str, str], ctl: Ctl) -> None:
    """A table made by hand (or before the trail): its commands work; audit says how."""
    key = cli_env["LOCK_KEY"]
    assert ctl("pause", key, "--reason", "disk full").returncode == 0
    assert ctl("resume", key).returncode == 0
    result = ctl("audit")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("dislockctl: error: no audit table: run init"), result.stderr
