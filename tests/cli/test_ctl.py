"""dislockctl against a real PostgreSQL: init, ls, release, check."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from dislock.core.rows import lease_key, schedule_key
from tests.cli.conftest import CTL, DISLOCK, Ctl
from tests.support.eventually import wait_for
from tests.support.rows import Rows


def columns(db: psycopg.Connection[Any], schema: str, table: str) -> list[str]:
    return [
        name
        for (name,) in db.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
            (schema, table),
        )
    ]


def test_init_creates_schema_and_table_idempotently(
    ctl: Ctl, db: psycopg.Connection[Any], cli_env: dict[str, str]
) -> None:
    schema = f"ops_{uuid.uuid4().hex[:8]}"
    try:
        printed = ctl("--table", f"{schema}.locks", "init", "--print-sql")
        assert printed.returncode == 0
        assert f'CREATE SCHEMA IF NOT EXISTS "{schema}";' in printed.stdout
        assert "fillfactor = 70" in printed.stdout
        assert columns(db, schema, "locks") == []  # printing executes nothing

        for _ in range(2):
            result = ctl("--table", f"{schema}.locks", "init")
            assert result.returncode == 0, result.stderr
        assert columns(db, schema, "locks") == ["key", "value", "expire_at"]

        fenced = ctl("--table", f"{schema}.locks", "init", "--fencing")
        assert fenced.returncode == 0, fenced.stderr
        assert columns(db, schema, "locks") == ["key", "value", "expire_at", "fence"]

        # The wrapper works on what init made.
        env = {**cli_env, "LOCK_TABLE": f"{schema}.locks", "LOCK_FENCING": "1"}
        run = subprocess.run(
            [*DISLOCK, "DATABASE_URL", "sh", "-c", "echo $DISLOCK_FENCING_TOKEN"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert (run.returncode, run.stdout) == (0, "1\n"), run.stderr
    finally:
        db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@contextmanager
def holding_lease(env: dict[str, str], workdir: Path) -> Iterator[subprocess.Popen[str]]:
    """A wrapper holding this test's slot and lease until the block ends."""
    script = f'touch "{workdir}/started"; while [ ! -e "{workdir}/stop" ]; do sleep 0.05; done'
    process = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", script],
        env={
            **env,
            "LOCK_STRATEGY": "schedule,lease",
            "RUN_LOCK_TTL_SECONDS": "5",
            "LOCK_LEASE_INTERVAL": "0.3",
        },
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(workdir / "started")
        yield process
    finally:
        (workdir / "stop").touch()
        process.communicate(timeout=20)


def test_keys_and_owners_with_control_characters_print_escaped(ctl: Ctl, rows: Rows) -> None:
    """Rows another version (or a hand) wrote: each still prints on one line."""
    for key, owner in ((schedule_key("two\nlines"), "own\ter"), (lease_key("rtl\u202eyek"), "o")):
        rows.db.execute(
            sql.SQL("INSERT INTO {} VALUES (%s, %s, NOW() + interval '1 hour')").format(rows.table),
            (key, owner),
        )
    listing = ctl("ls")
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert len(lines) == 4, listing.stdout  # a header, two locks, the table's limits
    assert lines[1].startswith("rtl\\u202eyek  lease")
    assert lines[2].startswith("two\\nlines") and "own\\ter" in lines[2]
    released = ctl("release", "two\nlines", "--owner", "own\ter")
    assert released.returncode == 0, released.stderr
    assert released.stdout.count("\n") == 1 and "held by own\\ter" in released.stdout


def test_ls_shows_owners_expiry_and_state(
    ctl: Ctl, cli_env: dict[str, str], rows: Rows, tmp_path: Path
) -> None:
    with holding_lease(cli_env, tmp_path):
        rows.db.execute(
            sql.SQL("INSERT INTO {} VALUES (%s, 'gone:1:00', NOW() - interval '5 minutes')").format(
                rows.table
            ),
            (lease_key("other-job"),),
        )
        table = ctl("ls")
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].split() == ["LOCK", "KEY", "MODE", "OWNER", "EXPIRES", "FENCE", "STATE"]
        key = cli_env["LOCK_KEY"]
        held = [line for line in lines if line.startswith(key)]
        # The schedule row only says its slot is taken; the lease that its run runs.
        assert len(held) == 2 and held[0].endswith("slot taken") and held[1].endswith("running")
        expired = [line for line in lines if line.startswith("other-job")]
        # Expired 5 minutes before the insert, plus however long `ls` took to start.
        assert len(expired) == 1 and expired[0].endswith("expired")
        assert re.search(r"expired 5m[0-5]\ds ago", expired[0]), expired[0]

        listed = json.loads(ctl("ls", key, "--json").stdout)
        assert {(entry["mode"], entry["held"]) for entry in listed} == {
            ("schedule", True),
            ("lease", True),
        }
        lease = next(entry for entry in listed if entry["mode"] == "lease")
        # NOW() is when a statement's transaction started, not when its snapshot was taken:
        # a renewal that starts after `ls` started yet commits before `ls` reads can show a
        # few microseconds more than the TTL.
        assert 0 < lease["expires_in_seconds"] < 5 + 0.5
        assert lease["fence"] is None
        assert ctl("ls", "no-such-prefix").stdout.startswith("no locks in")


def test_ls_lists_each_lock_keys_rows_together(ctl: Ctl, rows: Rows) -> None:
    """A key's schedule slot, lease (with its slots) and pause come on adjacent lines,
    though their row keys sort apart (every lease, then every pause, then every slot)."""
    for key, owner, seconds in [
        (lease_key("alpha"), "a:1:00", 60),
        (schedule_key("beta"), "b:1:00", 3600),
        (lease_key("beta"), "b:1:00", 60),
        ("cronjob-lock:lease#2:beta", "b:2:00", -30),
        (schedule_key("gamma"), "g:1:00", 3600),
        (lease_key("gamma"), "g:1:00", 60),
    ]:
        rows.plant(key, owner, seconds)
    assert ctl("pause", "beta", "--for", "1h", "--reason", "upgrade").returncode == 0
    expected = [
        ("alpha", "lease", 1),
        ("beta", "schedule", 1),
        ("beta", "lease", 1),
        ("beta", "lease", 2),
        ("beta", "pause", 1),
        ("gamma", "schedule", 1),
        ("gamma", "lease", 1),
    ]

    listed = ctl("ls", "--json")
    assert listed.returncode == 0, listed.stderr
    found = [(row["lock_key"], row["mode"], row["slot"]) for row in json.loads(listed.stdout)]
    assert found == expected

    table = ctl("ls")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()[1:-1]  # no header, no table limits
    assert [line.split()[:2] for line in lines] == [
        ["alpha", "lease"],
        ["beta", "schedule"],
        ["beta", "lease"],  # the lease's two slots under one line: 1/2 held
        ["slot", "1"],
        ["slot", "2"],
        ["beta", "pause"],
        ["gamma", "schedule"],
        ["gamma", "lease"],
    ], table.stdout
    assert lines[2].endswith("1/2 held") and lines[5].endswith("paused: upgrade")


def test_release_lease_makes_its_holder_stop_with_75(
    ctl: Ctl, cli_env: dict[str, str], rows: Rows, tmp_path: Path
) -> None:
    key = cli_env["LOCK_KEY"]
    with holding_lease(cli_env, tmp_path) as holder:
        owner = rows.get(lease_key(key))
        assert owner is not None

        wrong = ctl("release", key, "--mode", "lease", "--owner", "someone-else")
        assert wrong.returncode == 0 and wrong.stdout.startswith("nothing to release")
        still = rows.get(lease_key(key))
        assert still is not None and still.value == owner.value and not still.expired

        released = ctl("release", key, "--mode", "lease", "--owner", owner.value)
        assert released.returncode == 0, released.stderr
        assert f"released lease {key!r} held by {owner.value}" in released.stdout
        assert holder.wait(timeout=20) == 75
        assert holder.stderr is not None
        stderr = holder.stderr.read()
    # The holder says it was released, by whom (the database role and dislockctl's host),
    # and so does ls.
    role = rows.db.execute("SELECT current_user").fetchone()
    assert role is not None
    by = f"{role[0]} on {socket.gethostname()}"
    assert f"lock row is no longer ours: released by dislockctl as {by}; terminating" in stderr
    assert "expired, released or taken" not in stderr
    listed = ctl("ls", key)
    assert f"released (by dislockctl as {by})" in listed.stdout, listed.stdout
    (lease,) = [r for r in json.loads(ctl("ls", key, "--json").stdout) if r["mode"] == "lease"]
    assert (lease["state"], lease["forced"], lease["owner"]) == ("released", True, owner.value)
    assert lease["released_by"] == by

    slot = rows.get(schedule_key(key))
    assert slot is not None and not slot.expired  # --mode lease left the slot alone
    again = ctl("release", key)
    assert f"released schedule {key!r}" in again.stdout
    slot = rows.get(schedule_key(key))
    assert slot is not None and slot.expired


def test_check_reports_without_acquiring(ctl: Ctl, cli_env: dict[str, str], rows: Rows) -> None:
    env = {**cli_env, "LOCK_STRATEGY": "schedule,lease", "CRON_SCHEDULE": "*/15 * * * *"}
    result = ctl("check", env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "configuration is valid" in out
    assert "strategies      schedule,lease" in out
    assert "heartbeat       10 s" in out  # derived from the 60 s default TTL
    slot_line = next(line for line in out.splitlines() if "slot ends" in line)
    slot_end = datetime.fromisoformat(slot_line.split()[2])
    assert (
        slot_end.minute % 15 == 0 and slot_end.second == 0 and slot_end.utcoffset() == timedelta(0)
    )
    assert out.count("free: a run now would take it") == 2
    now_line = next(line for line in out.splitlines() if "database now" in line)
    assert re.fullmatch(r"  database now    \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", now_line)
    assert rows.get(schedule_key(cli_env["LOCK_KEY"])) is None
    assert rows.get(lease_key(cli_env["LOCK_KEY"])) is None


@pytest.mark.parametrize(
    ("zone_env", "shown"),
    [
        ({"CRON_TZ": "America/New_York", "TZ": "Asia/Tokyo"}, "America/New_York (from CRON_TZ)"),
        ({"TZ": "Etc/GMT+5"}, "Etc/GMT+5 (from TZ)"),
    ],
)
def test_check_shows_the_zone_the_schedule_is_read_in(
    ctl: Ctl, cli_env: dict[str, str], zone_env: dict[str, str], shown: str
) -> None:
    env = {**cli_env, "CRON_SCHEDULE": "0 9 * * *", **zone_env}
    result = ctl("check", env=env)
    assert result.returncode == 0, result.stderr
    assert f"time zone       {shown}" in result.stdout
    slot_line = next(line for line in result.stdout.splitlines() if "slot ends" in line)
    local = datetime.fromisoformat(slot_line.split("; ")[1].split()[0])
    assert (local.hour, local.minute) == (9, 0)


@pytest.mark.parametrize(
    ("args", "env_overrides", "status", "message"),
    [
        (["check"], {"LOCK_STRATEGY": "mutex"}, 2, "LOCK_STRATEGY='mutex'"),
        (["ls"], {"LOCK_TABLE": "no_such_table"}, 1, "dislockctl URL_VARIABLE init"),
        (["ls"], {"DATABASE_URL": ""}, 2, "DATABASE_URL is unset or empty"),
        # A typo, not an unreachable server: libpq itself refuses it only when connecting.
        (
            ["ls"],
            {"DATABASE_URL": "postgresql://app:hunter2@127.0.0.1:notaport/app"},
            2,
            "DATABASE_URL: database URL's port is not a number from 1 to 65535",
        ),
        (["release"], {}, 2, "LOCK_KEY"),
        ([], {}, 2, "COMMAND"),
    ],
)
def test_errors_are_one_line_with_the_documented_status(
    ctl: Ctl,
    cli_env: dict[str, str],
    args: Sequence[str],
    env_overrides: dict[str, str],
    status: int,
    message: str,
) -> None:
    result = ctl(*args, env={**cli_env, **env_overrides})
    assert result.returncode == status
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    "command",
    [["pause"], ["pause", "--for", "1h"], ["resume"], ["release"], ["rerun"], ["missed"]],
    ids=" ".join,
)
def test_a_key_no_wrapper_can_take_is_refused_before_connecting(
    ctl: Ctl, cli_env: dict[str, str], rows: Rows, command: list[str]
) -> None:
    """The wrapper refuses keys over 2048 bytes; pausing one would only pause nothing."""
    key = "k" * 3000
    env = {**cli_env, "DATABASE_URL": "postgresql://app:hunter2@127.0.0.1:1/app"}
    result = ctl(command[0], key, *command[1:], env=env)  # an unreachable server: never asked
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "dislockctl: error: LOCK_KEY is 3000 bytes long; at most 2048 bytes (UTF-8) are accepted\n"
    )
    assert result.stdout == ""
    assert ctl("pause", key[:2048], "--for", "1h").returncode == 0  # the longest key is taken


def test_help_lists_every_command(ctl: Ctl) -> None:
    result = subprocess.run([*CTL, "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0
    for command in ("init", "ls", "status", "release", "check"):
        assert command in result.stdout


def test_table_option_after_the_command(ctl: Ctl, cli_env: dict[str, str], rows: Rows) -> None:
    env = {key: value for key, value in cli_env.items() if key != "LOCK_TABLE"}
    result = ctl("ls", "--table", cli_env["LOCK_TABLE"], env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("no locks in")


def test_init_on_an_existing_table_needs_no_ddl_rights(
    ctl: Ctl, cli_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    role = f"app_{uuid.uuid4().hex[:8]}"
    schema = cli_env["LOCK_TABLE"].split(".")[0]
    db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        db.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(*map(sql.Identifier, (schema, role)))
        )
        params = conninfo_to_dict(cli_env["DATABASE_URL"])
        params["user"] = role
        env = {**cli_env, "DATABASE_URL": make_conninfo("", **params)}
        existing = ctl("init", env=env)
        assert existing.returncode == 0, existing.stderr
        assert "already exists" in existing.stdout
        fencing = ctl("init", "--fencing", env=env)  # would need ALTER TABLE
        assert fencing.returncode == 1
        assert "may not create the lock table" in fencing.stderr and "--print-sql" in fencing.stderr
    finally:
        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_check_reports_a_missing_fence_column(ctl: Ctl, cli_env: dict[str, str]) -> None:
    result = ctl("check", env={**cli_env, "LOCK_FENCING": "1"})
    assert result.returncode == 1
    assert "init --fencing" in result.stderr


def test_check_validates_before_connecting(ctl: Ctl, cli_env: dict[str, str]) -> None:
    env = {**cli_env, "LOCK_STRATEGY": "mutex", "DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}
    result = ctl("check", env=env)
    assert result.returncode == 2
    assert "LOCK_STRATEGY='mutex'" in result.stderr
