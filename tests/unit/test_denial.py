"""The one line for a refused statement: what a command needs, and how the missing
part is worded (the server is asked in ``tests/cli/test_privileges.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dislock.cli.admin import no_row_text
from dislock.cli.diagnosis import (
    HISTORY_TABLE,
    LOCK_TABLE,
    PRIVILEGES,
    RowSecurity,
    denial_hint,
    describe_database_error,
    describe_denial,
    grant_line,
    needs_of,
    privilege_probe,
)
from dislock.core.grants import OPERATOR, READER, WRAPPER, Grant
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
        " no grant covers that key (dislockctl grants says whose key it is; a key of this"
        " team's, the table's owner adds to its grant with dislockctl grant)"
    )


BILLING = Grant("billing", WRAPPER, ("billing-*", "reports-nightly"))


def _limited(grant: Grant | None, role: str = "billing") -> RowSecurity:
    return RowSecurity(role, limited=True, grant=grant)


@pytest.mark.parametrize(
    ("command", "security", "key", "line"),
    [
        # A wrapper pausing its own key: an operator's grant, with the keys it has
        # (a grant replaces the role's earlier one), never a GRANT of UPDATE.
        (
            "pause",
            _limited(BILLING),
            "billing-export",
            "dislockctl URL_VARIABLE grant billing --operator"
            " --keys 'billing-*' --keys 'reports-nightly'",
        ),
        (
            "release",
            _limited(Grant("ops", OPERATOR, ("billing-*",)), "ops"),
            "payroll-run",
            "dislockctl URL_VARIABLE grant ops --operator --keys 'billing-*' --keys 'payroll-run'",
        ),
        (
            "history --prune-older-than",
            _limited(None, "jobs"),
            None,
            "dislockctl URL_VARIABLE grant jobs --operator --keys 'PATTERN'",
        ),
        (
            "ls",
            _limited(None, "monitoring"),
            None,
            "dislockctl URL_VARIABLE grant monitoring --reader",
        ),
        (
            "missed",
            _limited(None, "monitoring"),
            "x",
            "dislockctl URL_VARIABLE grant monitoring --reader",
        ),
        # A role with a grant reading a table it does not cover (a history table created
        # after the grant): its own grant again, not a reader's that would replace it.
        (
            "history",
            _limited(BILLING),
            None,
            "dislockctl URL_VARIABLE grant billing --keys 'billing-*' --keys 'reports-nightly'",
        ),
        (
            "dislock",
            _limited(Grant("watch", READER, ())),
            "it's-mine",
            "dislockctl URL_VARIABLE grant billing --keys 'it'\"'\"'s-mine'",
        ),
        (
            "dislock",
            _limited(None, "we ird"),
            "k",
            "dislockctl URL_VARIABLE grant 'we ird' --keys 'k'",
        ),
        # The owner's commands, and a table without row-level security (a grant there
        # would lock out every role of the broad GRANT): no grant line.
        ("grant", _limited(None), "k", None),
        ("pause", RowSecurity("billing", limited=False, grant=None), "k", None),
    ],
)
def test_the_grant_that_gives_a_command_its_key(
    command: str, security: RowSecurity, key: str | None, line: str | None
) -> None:
    assert grant_line(command, security, key) == line


REPORTS = Grant("reports", WRAPPER, ("reports-*",))
OPS = Grant("ops", OPERATOR, ("billing-*",))
WATCH = Grant("watch", READER, ())


@pytest.mark.parametrize(
    ("command", "security", "key", "hint"),
    [
        # Another team's key: whose it is, never a grant of it to this team (#62).
        (
            "release",
            _limited(BILLING),
            "reports-export",
            "'reports-export' is a key of role reports: ask that team, or the table's owner,"
            " to run it",
        ),
        (
            "dislock",
            _limited(None, "payroll"),
            "billing-export",
            "'billing-export' is a key of roles billing, ops: ask that team, or the table's"
            " owner, to run it",
        ),
        # The role's own key (an operator's grant covers it too), a key nobody's grant
        # covers, and a reader's grant, which claims no key: the grant, as before.
        (
            "pause",
            _limited(BILLING),
            "billing-export",
            "as the table's owner, dislockctl URL_VARIABLE grant billing --operator"
            " --keys 'billing-*' --keys 'reports-nightly'",
        ),
        (
            "release",
            _limited(OPS, "ops"),
            "payroll-run",
            "as the table's owner, dislockctl URL_VARIABLE grant ops --operator"
            " --keys 'billing-*' --keys 'payroll-run'",
        ),
        (
            "ls",
            _limited(None, "monitoring"),
            None,
            "as the table's owner, dislockctl URL_VARIABLE grant monitoring --reader",
        ),
        ("pause", RowSecurity("billing", limited=False, grant=None), "reports-x", None),
    ],
)
def test_a_key_of_another_teams_grant_is_theirs_to_act_on(
    command: str, security: RowSecurity, key: str | None, hint: str | None
) -> None:
    grants = [BILLING, REPORTS, OPS, WATCH]
    assert denial_hint(command, security, key, grants) == hint


def test_under_row_level_security_the_line_names_the_grant_not_a_privilege() -> None:
    needs = needs_of("pause", {LOCK_TABLE: ("ops", "locks")})
    update = [need for need in needs if need.privilege == "UPDATE"]
    fix = "dislockctl URL_VARIABLE grant billing --operator --keys 'billing-*'"
    hint = f"as the table's owner, {fix}"
    line = describe_denial(
        "pause", missing=update, role="billing", table="ops.locks", detail="x", fix=hint
    )
    assert line == (
        "pause: permission denied: UPDATE on table ops.locks for role billing (row-level security"
        f" is on: as the table's owner, {fix}, see docs/security.md)"
    )
    line = describe_denial(
        "", missing=[], role="billing", table="ops.locks", detail="new row violates", fix=hint
    )
    assert line == (
        "permission denied on table ops.locks for role billing: new row violates (row-level"
        f" security is on: as the table's owner, {fix}, see docs/security.md)"
    )


def test_a_reader_refused_by_the_server_is_told_the_readers_grant() -> None:
    error = SimpleNamespace(sqlstate="42501")
    line = describe_database_error(error, table_parts=("ops", "locks"), url="postgresql://db/x")  # type: ignore[arg-type]
    assert line.startswith("permission denied on lock table ops.locks (")
    assert line.endswith(
        "reading it needs SELECT on it (where the table has grants:"
        " dislockctl URL_VARIABLE grant ROLE --reader, see docs/security.md)"
    )
    assert "INSERT" not in line


def test_a_release_that_found_no_row_says_when_the_row_may_be_hidden() -> None:
    assert no_row_text("reports-x", ("schedule", "lease"), ("ops", "locks")) == (
        "no schedule or lease lock row for 'reports-x' in ops.locks (see dislockctl ls)"
    )
    assert no_row_text("reports-x", ("lease",), ("ops", "locks"), hidden_from="ops") == (
        "no lease lock row for 'reports-x' that role 'ops' may see in ops.locks: the row may"
        " exist, but no grant of that role covers the key (row-level security;"
        " dislockctl URL_VARIABLE grants lists the grants)"
    )


@pytest.mark.parametrize(
    ("security", "key", "hides"),
    [
        (_limited(BILLING), "billing-x", False),
        (_limited(BILLING), "reports-nightly", False),
        (_limited(BILLING), "reports-nightly-2", True),
        (_limited(None), "billing-x", True),
        (_limited(Grant("watch", READER, ())), "anything", False),
        (RowSecurity("owner", limited=False, grant=None), "anything", False),
    ],
)
def test_which_keys_row_level_security_hides_from_a_role(
    security: RowSecurity, key: str, hides: bool
) -> None:
    assert security.hides(key) is hides
