"""``dislockctl audit``: the lock table's audit trail, oldest first: when, who (the
login role, and the role it acted as), which action on which key, and why
(``dislock.core.audit_trail``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dislock.cli import EXIT_OK, EXIT_USAGE
from dislock.cli.commands._call import Call, columns, error

if TYPE_CHECKING:
    from datetime import timedelta

    from dislock.cli.sending import Connection
    from dislock.core.audit_trail import Entry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--key", dest="lock_key", metavar="LOCK_KEY", help="only this lock key")
    parser.add_argument("--since", metavar="DURATION", help="only this far back (e.g. 7d)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(call: Call) -> int:
    from dislock.cli.time_args import parse_duration

    since = None if call.args.since is None else parse_duration(call.args.since, name="--since")
    return call.connected(lambda conn: _audit(conn, call, since))


def _audit(conn: Connection, call: Call, since: timedelta | None) -> int:
    import json

    from dislock.cli.admin import DATABASE_NOW
    from dislock.cli.sending import send
    from dislock.core.audit_trail import audit_table, entries

    trail = audit_table(call.table)
    if not columns(conn, trail):
        return error(
            f"no audit table: run init (as the owner of {'.'.join(call.table)}: it creates"
            f" {'.'.join(trail)})",
            EXIT_USAGE,
        )
    start = None if since is None else send(conn, DATABASE_NOW) - since
    found = send(conn, entries(trail, call.args.lock_key, start))
    if call.args.json:
        rows = [entry._asdict() | {"at": entry.at.isoformat()} for entry in found]
        print(json.dumps(rows, indent=2))
    else:
        print("\n".join(map(entry_line, found)) if found else "no audited actions")
    return EXIT_OK


def entry_line(entry: Entry) -> str:
    """One row of the trail, as `audit` prints it (and a key's page in serve shows it)."""
    from dislock.cli.runs.history_report import format_time
    from dislock.core.bounds import escape

    acted = "" if entry.acted_as == entry.login_role else f" as {entry.acted_as}"
    parts = [
        f"{format_time(entry.at)} UTC",
        entry.action,
        entry.lock_key or "(table)",
        f"by {entry.login_role}{acted}",
        *([entry.detail] if entry.detail else []),
        *([f"reason: {entry.reason}"] if entry.reason else []),
    ]
    return escape("  ".join(parts))
