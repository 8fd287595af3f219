"""The one line for a refused statement: what a command needs, and how the missing
part is worded (the server is asked in ``tests/cli/test_privileges.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dislock.cli.diagnosis import (
    HISTORY_TABLE,
    LOCK_TABLE,
    PRIVILEGES,
    describe_denial,
    needs_of,
    privilege_probe,
)
from dislock.core.refusal import refused


def test_needs_name_the_schema_first_and_skip_absent_tables() -> None:
    needs = needs_of("history", {LOCK_TABLE: ("ops", "locks"), HISTORY_TABLE: ("runs",)})
    assert [(n.privilege, n.kind, n.name) for n in needs] == [
        ("SELECT", "table", "runs"),
        ("USAGE", "schema", "ops"),
        ("SELECT", "table", "ops.locks"),
    ]
    assert needs_of("history", {LOCK_TABLE: ("locks",), HISTORY_TABLE: None})[0].name == "locks"
    assert needs_of("no-such-command", {LOCK_TABLE: ("locks",)}) == []


def test_the_probe_looks_a_table_up_only_where_its_schema_is_usable() -> None:
    query, params = privilege_probe(needs_of("resume", {LOCK_TABLE: ('we"ird', "locks")}))
    assert query.count("%s") == len(params)
    assert params == [
        'we"ird',
        'we"ird', '"we""ird"."locks"', "SELECT",
        'we"ird', '"we""ird"."locks"', "DELETE",
    ]  # fmt: skip
    assert "CASE WHEN has_schema_privilege" in query


def test_missing_privileges_are_grouped_by_object() -> None:
    needs = needs_of("resume", {LOCK_TABLE: ("ops", "locks")})
    line = describe_denial("resume", missing=needs, role="jobs", table="ops.locks", detail="x")
    assert line == (
        "resume: permission denied: USAGE on schema ops, SELECT and DELETE on table ops.locks"
        " for role jobs (grant them, see docs/security.md)"
    )


def test_nothing_missing_quotes_the_server() -> None:
    line = describe_denial("", missing=[], role=None, table="locks", detail="new row violates")
    assert line == (
        "permission denied on table locks for this role: new row violates (see docs/security.md)"
    )


def test_every_command_needs_select_somewhere() -> None:
    for command, needs in PRIVILEGES.items():
        assert any("SELECT" in privileges for _, privileges in needs), command


class _Refusal(Exception):
    """A statement row-level security refused, as psycopg reports it."""

    sqlstate = "42501"
    diag = SimpleNamespace(
        message_primary='new row violates row-level security policy for table "locks"'
    )


@pytest.mark.parametrize(
    ("row_key", "strategy"),
    [
        ("cronjob-lock:lease:reports-daily", "lease"),
        ("cronjob-lock:lease#2:reports-daily", "lease"),
        ("cronjob-lock:schedule:reports-daily", "schedule"),
    ],
)
def test_a_key_refused_by_the_grant_is_named_as_the_docs_name_it(
    row_key: str, strategy: str
) -> None:
    refusal = refused(
        _Refusal(), url="postgresql://billing@db/app", key=row_key, table_parts=("ops", "locks")
    )
    assert refusal is not None
    assert str(refusal) == (
        f"role 'billing' may not lock 'reports-daily' (strategy {strategy}) in ops.locks:"
        " no grant covers that key (dislockctl grants lists them; dislockctl grant adds one)"
    )
