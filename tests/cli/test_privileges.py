"""A role missing a privilege: every command (the wrapper and each dislockctl command)
says in one line which privilege on which table, exits 1, and writes nothing."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from dislock.core.history import create_history
from dislock.core.rows import lease_key, pause_key
from tests.cli.conftest import Ctl, RunCli

PASSWORD = "hunter2-secret"
LOCKS, HISTORY = "key_value", "key_value_history"

Grants = Mapping[str, Sequence[str]]
"""Privileges by table name (``LOCKS``, ``HISTORY``), all in the test's schema."""
MakeRole = Callable[..., tuple[str, str]]

# Each command, what it needs (diagnosis.PRIVILEGES) and the argv to run it with.
COMMANDS: dict[str, tuple[Grants, list[str]]] = {
    "dislock": ({LOCKS: ("SELECT", "INSERT", "UPDATE")}, []),
    "ls": ({LOCKS: ("SELECT",)}, ["ls"]),
    "check": ({LOCKS: ("SELECT",)}, ["check"]),
    "release": ({LOCKS: ("SELECT", "UPDATE")}, ["release", "held-job"]),
    "pause": ({LOCKS: ("SELECT", "INSERT", "UPDATE")}, ["pause", "held-job"]),
    "resume": ({LOCKS: ("SELECT", "DELETE")}, ["resume", "paused-job"]),
    "history": ({HISTORY: ("SELECT",), LOCKS: ("SELECT",)}, ["history"]),
    "prune": ({HISTORY: ("SELECT", "DELETE")}, ["history", "--prune-older-than", "1h"]),
    "missed": (
        {HISTORY: ("SELECT",), LOCKS: ("SELECT",)},
        ["missed", "held-job", "--schedule", "0 0 1 1 *"],
    ),
}
UNREACHED = {("missed", LOCKS, "SELECT")}
"""Needed, but not by the argv above: ``missed`` reads the lock table only for a key
that recorded no schedule."""
CASES = [
    (command, table, privilege)
    for command, (grants, _) in COMMANDS.items()
    for table, privileges in grants.items()
    for privilege in privileges
    if (command, table, privilege) not in UNREACHED
]


@pytest.fixture
def tables(cli_env: dict[str, str], db: psycopg.Connection[Any]) -> dict[str, sql.Identifier]:
    """The test's lock and history tables, with a held lease, a pause and an old run
    for the commands to act on."""
    schema = cli_env["LOCK_TABLE"].split(".")[0]
    for statement in create_history((schema, HISTORY)):
        db.execute(statement)
    found = {name: sql.Identifier(schema, name) for name in (LOCKS, HISTORY)}
    db.execute(
        sql.SQL(
            "INSERT INTO {} VALUES (%s, 'host:1:abcdef01', NOW() + interval '1 hour'),"
            " (%s, 'on purpose', '9999-12-31 00:00:00+00')"
        ).format(found[LOCKS]),
        (lease_key("held-job"), pause_key("paused-job")),
    )
    db.execute(
        sql.SQL(
            "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at, ended_at, outcome)"
            " VALUES ('held-job', 'lease', 'o', 'web-1', 1, NOW() - interval '2 hours',"
            " NOW() - interval '2 hours', 'ok')"
        ).format(found[HISTORY])
    )
    return found


@pytest.fixture
def make_role(
    cli_env: dict[str, str], db: psycopg.Connection[Any], tables: dict[str, sql.Identifier]
) -> Iterator[MakeRole]:
    """A login role with exactly ``grants`` (and USAGE on the schema unless told not):
    its name and URL."""
    schema = cli_env["LOCK_TABLE"].split(".")[0]
    made: list[str] = []

    def make(grants: Grants, *, usage: bool = True) -> tuple[str, str]:
        role = f"r_{uuid.uuid4().hex[:8]}"
        made.append(role)
        name = sql.Identifier(role)
        db.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(name, sql.Literal(PASSWORD)))
        if usage:
            db.execute(
                sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), name)
            )
        for table, privileges in grants.items():
            if privileges:
                db.execute(
                    sql.SQL("GRANT {} ON {} TO {}").format(
                        sql.SQL(", ").join(map(sql.SQL, privileges)), tables[table], name
                    )
                )
        params = conninfo_to_dict(cli_env["DATABASE_URL"])
        params.update(user=role, password=PASSWORD)
        return role, make_conninfo("", **params)

    yield make
    for role in made:
        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _contents(db: psycopg.Connection[Any], tables: dict[str, sql.Identifier]) -> list[Any]:
    return [
        db.execute(sql.SQL("SELECT t::text FROM {} AS t ORDER BY 1").format(table)).fetchall()
        for table in tables.values()
    ]


def _run(
    command: str, url: str, env: dict[str, str], run_cli: RunCli, ctl: Ctl, marker: Path
) -> Any:
    env = {**env, "DATABASE_URL": url, "LOCK_KEY": "new-job"}
    if command == "dislock":
        return run_cli(["DATABASE_URL", "touch", str(marker)], env)
    return ctl(*COMMANDS[command][1], env=env)


@pytest.mark.parametrize(("command", "table", "privilege"), CASES)
def test_a_missing_privilege_is_one_line_naming_it(
    command: str,
    table: str,
    privilege: str,
    cli_env: dict[str, str],
    db: psycopg.Connection[Any],
    tables: dict[str, sql.Identifier],
    make_role: MakeRole,
    run_cli: RunCli,
    ctl: Ctl,
    tmp_path: Path,
) -> None:
    grants = {
        name: [p for p in privileges if (name, p) != (table, privilege)]
        for name, privileges in COMMANDS[command][0].items()
    }
    role, url = make_role(grants)
    before = _contents(db, tables)
    marker = tmp_path / "ran"
    result = _run(command, url, cli_env, run_cli, ctl, marker)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    program = "dislock: error:" if command == "dislock" else "dislockctl: error:"
    assert lines[0].startswith(program)
    schema = cli_env["LOCK_TABLE"].split(".")[0]
    assert (
        f"permission denied: {privilege} on table {schema}.{table} for role {role}"
        " (grant it, see docs/security.md)"
    ) in lines[0]
    assert "Traceback" not in result.stderr and PASSWORD not in result.stderr + result.stdout
    assert not marker.exists()
    assert _contents(db, tables) == before


@pytest.mark.parametrize("command", list(COMMANDS))
def test_what_each_command_needs_is_enough(
    command: str,
    cli_env: dict[str, str],
    make_role: MakeRole,
    run_cli: RunCli,
    ctl: Ctl,
    tmp_path: Path,
) -> None:
    """The other half of the table: with exactly its privileges, each command works."""
    _, url = make_role(COMMANDS[command][0])
    marker = tmp_path / "ran"
    result = _run(command, url, cli_env, run_cli, ctl, marker)
    assert result.returncode == 0, result.stderr
    assert marker.exists() is (command == "dislock")


def test_a_schema_the_role_may_not_use_is_named(
    cli_env: dict[str, str],
    make_role: MakeRole,
    ctl: Ctl,
) -> None:
    role, url = make_role(COMMANDS["ls"][0], usage=False)
    result = ctl("status", env={**cli_env, "DATABASE_URL": url})
    assert result.returncode == 1
    schema = cli_env["LOCK_TABLE"].split(".")[0]
    assert result.stderr.strip() == (
        f"dislockctl: error: status: permission denied: USAGE on schema {schema}"
        f" for role {role} (grant it, see docs/security.md)"
    )


def test_a_refusal_no_missing_grant_explains_quotes_the_server(
    cli_env: dict[str, str],
    db: psycopg.Connection[Any],
    tables: dict[str, sql.Identifier],
    make_role: MakeRole,
    ctl: Ctl,
) -> None:
    """Refused though the role holds every privilege the command needs (here by a
    row-level security policy, also SQLSTATE 42501): the server's words, in one line."""
    role, url = make_role(COMMANDS["pause"][0])
    db.execute(sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(tables[LOCKS]))
    db.execute(
        sql.SQL("CREATE POLICY no_new_rows ON {} USING (true) WITH CHECK (false)").format(
            tables[LOCKS]
        )
    )
    result = ctl("pause", "new-job", env={**cli_env, "DATABASE_URL": url})
    assert result.returncode == 1, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    schema = cli_env["LOCK_TABLE"].split(".")[0]
    assert lines[0].startswith(
        f"dislockctl: error: pause: permission denied on table {schema}.key_value for role {role}: "
    )
    assert "row-level security" in lines[0] and lines[0].endswith("(see docs/security.md)")
