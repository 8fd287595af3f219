"""``dislockctl ls`` (also ``status``): every lock row, held, released, expired
(abandoned), ended slots and pauses; then the table's limits and a running lock
delay."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dislock.cli import EXIT_OK
from dislock.cli.commands._call import Call
from dislock.cli.sending import send
from dislock.core.kinds import GROUP

if TYPE_CHECKING:
    from dislock.cli.lock_rows import LockRow
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
    return call.connected(lambda conn: _list(conn, call, args.prefix, args.json))


def _list(conn: Connection, call: Call, prefix: str, as_json: bool) -> int:
    from dislock.cli.admin import render_json, render_table
    from dislock.cli.lock_rows import listing

    table = call.table
    rows = send(conn, listing(table, prefix))
    waiting = _waiting(conn, call, rows)
    if as_json:
        print(render_json(rows, waiting))
        return EXIT_OK
    if rows:
        print(render_table(rows, waiting))
        for line in _groups(rows):
            print(line)
    else:
        print(f"no locks in {'.'.join(table)}" + (f" starting with {prefix!r}" if prefix else ""))
    print(_table_limits(conn, table))
    return EXIT_OK


def _waiting(conn: Connection, call: Call, rows: list[LockRow]) -> set[str]:
    """The held lease rows whose run waits for its group, as the run history tells
    (``lock_rows.waiting_for_group``); none without a history table."""
    import psycopg.errors

    from dislock.cli.commands._call import columns
    from dislock.cli.lock_rows import waiting_for_group
    from dislock.cli.runs.run_history import unstarted
    from dislock.core.errors import ConfigurationError
    from dislock.core.kinds import LEASE

    leases = [row for row in rows if row.mode == LEASE and row.held]
    try:
        history = call.history_table()
    except ConfigurationError:
        return set()  # ls reads the lock table alone: a wrong history name is not its error
    if not leases or not columns(conn, history):
        return set()
    try:
        found = send(conn, unstarted(history, [(row.lock_key, row.owner) for row in leases]))
    except psycopg.errors.InsufficientPrivilege:
        return set()  # a role that may not read the history: told apart by nothing
    keys = {row.key for row, flag in zip(leases, found, strict=True) if flag}
    return waiting_for_group(rows, lambda row: row.key in keys)


def _groups(rows: list[LockRow]) -> list[str]:
    """A line for each group listed: how many of its slots are held, and by whom (its
    N is each member's own setting: only the slots ever taken are rows)."""
    from dislock.core.bounds import printable

    held: dict[str, list[LockRow]] = {}
    for row in rows:
        if row.mode == GROUP.name:
            held.setdefault(row.lock_key, []).extend([row] if row.held else [])
    return [
        f"group {printable(name, limit=200)}: {len(slots)} held"
        + (f" (by {', '.join(printable(row.owner, limit=200) for row in slots)})" if slots else "")
        for name, slots in held.items()
    ]


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
