"""``dislockctl revoke``: take ROLE's grant away (``dislock.cli.commands._granting``)."""

from __future__ import annotations

import argparse

from dislock.cli.commands._call import Call
from dislock.cli.table_change import add_wait_argument, patience_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("role", metavar="ROLE")
    parser.add_argument(
        "--print-sql", action="store_true", help="print the statements instead of running them"
    )
    add_wait_argument(parser)


def run(call: Call) -> int:
    from dislock.cli.commands import _granting as grant_commands

    args = call.args
    history = call.history_table()
    patience = patience_of(args)
    return call.connected(
        lambda conn: grant_commands.revoke(
            conn,
            call.table,
            history,
            args.role,
            print_sql=args.print_sql,
            patience=patience,
        )
    )
