"""``dislockctl grants``: which role may lock which keys, the table's maximum lease
TTL, and any privilege given by hand that lets a role around the policies of the lock
table or its run history (exit 1)."""

from __future__ import annotations

import argparse

from dislock.cli.commands._call import Call


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(call: Call) -> int:
    from dislock.cli.commands import _granting as grant_commands

    history = call.history_table()
    return call.connected(
        lambda conn: grant_commands.list_grants(conn, call.table, history, as_json=call.args.json)
    )
