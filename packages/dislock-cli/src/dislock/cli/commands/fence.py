"""``dislockctl fence``: guard a table of the user's so that the database refuses every
write whose transaction does not carry the fencing token of LOCK_KEY's live lease
(``dislock.core.fencing``); ``--print-sql`` prints the statements for a DBA."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dislock.cli import EXIT_OK, EXIT_USAGE
from dislock.cli.commands._call import (
    PRINT_SQL_HELP,
    Call,
    add_reason_argument,
    audit,
    error,
    in_schema,
    print_sql,
)
from dislock.cli.sending import send

if TYPE_CHECKING:
    from dislock.cli.sending import Connection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("user_table", metavar="TABLE", help="'table' or 'schema.table'")
    parser.add_argument(
        "--key", dest="lock_key", metavar="LOCK_KEY", required=True, help="the lease's lock key"
    )
    parser.add_argument("--print-sql", action="store_true", help=PRINT_SQL_HELP)
    add_reason_argument(parser)


def run(call: Call) -> int:
    from dislock.core.bounds import check_key
    from dislock.core.config import parse_table

    user_table = parse_table(call.args.user_table)
    lock_key = check_key("--key", call.args.lock_key)
    if call.args.print_sql:
        from dislock.core.fencing import fence_statements

        statements = fence_statements(in_schema(call.table), user_table, lock_key)
        return print_sql(statements, transaction=True)
    return call.connected(lambda conn: _fence(conn, call, user_table, lock_key))


def _fence(conn: Connection, call: Call, user_table: tuple[str, ...], lock_key: str) -> int:
    from dislock.core.fencing import fence_statements, guard_installed, table_state
    from dislock.core.grant_catalog import qualified

    table = call.table
    lock_table = send(conn, qualified(table))
    shown, where = ".".join(user_table), ".".join(table)
    if lock_table is None or not send(conn, guard_installed(lock_table)):
        return error(
            f"lock table {where} has no fencing guard: run `dislockctl URL_VARIABLE init"
            " --fencing` as its owner first",
            EXIT_USAGE,
        )
    state = send(conn, table_state(user_table))
    if state is None:
        return error(f"table {shown} does not exist", EXIT_USAGE)
    if not state.owned:
        return error(f"this role does not own table {shown}: fence it as the table's owner")
    outside = _outside_scope(conn, table, lock_key)
    if outside is not None:
        return error(outside)
    with conn.transaction():
        for statement in fence_statements(lock_table, user_table, lock_key):
            conn.execute(statement)
        audit(conn, call, "fence", lock_key, shown)
    was = "" if state.key in (None, lock_key) else f" (it was guarded by {state.key!r})"
    print(
        f"fenced {shown}: a write commits only with the fencing token of the live lease"
        f" of {lock_key!r} in dislock.fencing_token{was}"
    )
    return EXIT_OK


def _outside_scope(conn: Connection, table: tuple[str, ...], lock_key: str) -> str | None:
    """Why this role may not fence by ``lock_key``: a role with a grant on the lock
    table (its own, or a team role's it is a member of) guards its tables by the keys
    of that grant only; the table's owner and superusers by any."""
    from dislock.cli.diagnosis import matches
    from dislock.core.fencing import scoped_roles
    from dislock.core.grant_catalog import grants_on
    from dislock.core.grants import READER

    roles = send(conn, scoped_roles(table))
    grants = [grant for grant in send(conn, grants_on(table)) if grant.role in roles]
    if not grants or any(
        grant.access != READER and matches(grant.keys, lock_key) for grant in grants
    ):
        return None
    covered = ", ".join(key for grant in grants for key in grant.keys) or "no key"
    return (
        f"this role may not fence by {lock_key!r}: its grant covers {covered}"
        " (dislockctl URL_VARIABLE grants)"
    )
