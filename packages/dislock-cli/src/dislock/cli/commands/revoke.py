"""``dislockctl revoke``: take ROLE's grant away (``dislock.cli.grant_commands``)."""

from __future__ import annotations

import argparse

from dislock.cli.commands._call import Call


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("role", metavar="ROLE")
    parser.add_argument(
        "--print-sql", action="store_true", help="print the statements instead of running them"
    )


def run(call: Call) -> int:
    from dislock.cli import grant_commands

    args = call.args
    history = call.history_table()
    return call.connected(
        lambda conn: grant_commands.revoke(
            conn, call.table, history, args.role, print_sql=args.print_sql
        )
    )
