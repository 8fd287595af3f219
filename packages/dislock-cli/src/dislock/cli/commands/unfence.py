"""``dislockctl unfence``: take ``fence``'s guard off a table (exit 1 if it had none):
the one way round the guard, for the table's owner."""

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
    print_sql,
)

if TYPE_CHECKING:
    from dislock.cli.sending import Connection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("user_table", metavar="TABLE", help="'table' or 'schema.table'")
    parser.add_argument("--print-sql", action="store_true", help=PRINT_SQL_HELP)
    add_reason_argument(parser)


def run(call: Call) -> int:
    from dislock.core.config import parse_table
    from dislock.core.fencing import unfence_statements

    user_table = parse_table(call.args.user_table)
    if call.args.print_sql:
        return print_sql(unfence_statements(user_table))
    return call.connected(lambda conn: _unfence(conn, call, user_table))


def _unfence(conn: Connection, call: Call, user_table: tuple[str, ...]) -> int:
    from dislock.cli.sending import send
    from dislock.core.fencing import table_state, unfence_statements

    shown = ".".join(user_table)
    state = send(conn, table_state(user_table))
    if state is None:
        return error(f"table {shown} does not exist", EXIT_USAGE)
    if state.key is None:
        return error(f"table {shown} is not fenced")
    with conn.transaction():
        for statement in unfence_statements(user_table):
            conn.execute(statement)
        audit(conn, call, "unfence", state.key, shown)
    print(f"unfenced {shown}: writes no longer need the fencing token of {state.key!r}")
    return EXIT_OK
