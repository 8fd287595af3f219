"""``dislockctl revoke``: take ROLE's grant away: it no longer sees or writes any row."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dislock.cli import EXIT_OK
from dislock.cli.commands._call import (
    PRINT_SQL_HELP,
    Call,
    add_reason_argument,
    columns,
    error,
    print_sql,
)
from dislock.cli.table_change import add_wait_argument, patience_of

if TYPE_CHECKING:
    from dislock.cli.sending import Connection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("role", metavar="ROLE")
    parser.add_argument("--print-sql", action="store_true", help=PRINT_SQL_HELP)
    add_reason_argument(parser)
    add_wait_argument(parser)


def run(call: Call) -> int:
    history = call.history_table()
    patience = patience_of(call.args)
    return call.connected(lambda conn: _revoke(conn, call, history, patience))


def _revoke(conn: Connection, call: Call, history: tuple[str, ...], patience: float) -> int:
    """In short tries: the role itself may be holding the tables, and every other
    role's statements would queue behind a revoke that waited."""
    from dislock.cli.commands._granting import audit_grant
    from dislock.cli.table_change import TableBusy, change
    from dislock.core import grant_policies, grants
    from dislock.core.audit_trail import audit_table
    from dislock.core.bounds import escape

    table, role = call.table, call.args.role
    history_parts = history if columns(conn, history) else None
    trail = audit_table(table)
    statements = grant_policies.revoke_statements(
        table,
        grants.check_role(role),
        history=history_parts,
        trail=trail if columns(conn, trail) else None,
    )
    if call.args.print_sql:
        return print_sql(statements)
    if conn.execute("SELECT FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
        return error(f"role {escape(role)!r} does not exist")

    def run(conn: Connection) -> None:
        for statement in statements:
            conn.execute(statement)
        audit_grant(conn, table, "revoke", role, call.args.reason)

    try:
        change(
            conn,
            "revoke",
            [table, *([history_parts] if history_parts else [])],
            run,
            patience=patience,
        )
    except TableBusy as busy:
        return error(str(busy))
    print(f"role {escape(role)!r} may no longer read or lock anything in {'.'.join(table)}")
    return EXIT_OK
