"""The one line for a refused statement: what a command needs, and how the missing
part is worded (the server is asked in ``tests/cli/test_privileges.py``)."""

from __future__ import annotations

from dislock.cli.diagnosis import (
    HISTORY_TABLE,
    LOCK_TABLE,
    PRIVILEGES,
    describe_denial,
    needs_of,
    privilege_probe,
)


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
