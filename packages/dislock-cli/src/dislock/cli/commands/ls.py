"""``dislockctl ls`` (also ``status``): every lock row, held, released, expired
(abandoned), ended slots and pauses; then the table's limits and a running lock
delay."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dislock.cli import EXIT_OK
from dislock.cli.commands._call import Call
from dislock.cli.sending import send

if TYPE_CHECKING:
    from dislock.cli.sending import Connection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prefix", nargs="?", default="", help="only lock keys starting so")
    parser.add_argument(
        "--json",
        action="store_true",
        help='machine-readable output (a text over 4096 characters is cut: "truncated": true)',
    )


def run(call: Call) -> int:
    args = call.args
    return call.connected(lambda conn: _list(conn, call.table, args.prefix, args.json))


def _list(conn: Connection, table: tuple[str, ...], prefix: str, as_json: bool) -> int:
    from dislock.cli.admin import render_json, render_table
    from dislock.cli.lock_rows import listing

    rows = send(conn, listing(table, prefix))
    if as_json:
        print(render_json(rows))
        return EXIT_OK
    if rows:
        print(render_table(rows))
    else:
        print(f"no locks in {'.'.join(table)}" + (f" starting with {prefix!r}" if prefix else ""))
    print(_table_limits(conn, table))
    return EXIT_OK


def _table_limits(conn: Connection, table: tuple[str, ...]) -> str:
    """The last line: the table's maximum lease TTL, and a running lock delay."""
    from dislock.cli.admin import describe_expiry
    from dislock.core.failover import delay_state
    from dislock.core.limits import max_ttl

    cap, recorded = send(conn, max_ttl(table))
    line = f"maximum lease TTL {cap:g} s" + ("" if recorded else " (the default)")
    delay = send(conn, delay_state(table))
    if delay is not None and delay.seconds_left > 0:
        ends = describe_expiry(delay.seconds_left)
        line += (
            "; LOCK DELAY after a failover: each key waits for the longest TTL of the roles"
            f" that may hold it, the last ends {ends}"
        )
    return line
