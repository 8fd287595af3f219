"""``dislockctl grants``: which role may lock which keys, and the table's maximum
lease TTL."""

from __future__ import annotations

import argparse

from dislock.cli.commands._call import Call


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(call: Call) -> int:
    from dislock.cli.commands import _granting as grant_commands

    return call.connected(
        lambda conn: grant_commands.list_grants(conn, call.table, as_json=call.args.json)
    )
