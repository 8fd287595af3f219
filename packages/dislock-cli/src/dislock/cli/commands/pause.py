"""``dislockctl pause``: every wrapper skips LOCK_KEY (exit 0) until the pause ends
or ``resume`` ends it.  The pause is a row of the lock table (``dislock.core.pause``),
and an event in the run history when there is one (``dislock.core.operator_commands``)."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from typing import TYPE_CHECKING

from dislock.cli import EXIT_OK, EXIT_USAGE
from dislock.cli.commands._call import (
    audit,
    check_key_and_reason,
    error,
    record_event,
    recorded_history,
)

if TYPE_CHECKING:
    from dislock.cli.commands._call import Call
    from dislock.cli.sending import Connection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lock_key", metavar="LOCK_KEY")
    until = parser.add_mutually_exclusive_group()
    until.add_argument("--for", dest="for_", metavar="DURATION", help="e.g. 2h, 30m, 1d")
    until.add_argument("--until", metavar="TIME", help="ISO 8601 time (UTC unless it says)")
    parser.add_argument(
        "--reason",
        default="",
        help="shown by ls and in every skip message (at most 1000 bytes, one line)",
    )


def run(call: Call) -> int:
    from dislock.cli.time_args import parse_duration, parse_time

    args = check_key_and_reason(call)
    seconds = None if args.for_ is None else parse_duration(args.for_, name="--for").total_seconds()
    until = None if args.until is None else parse_time(args.until, name="--until")
    history = recorded_history(call)
    return call.connected(
        lambda conn: _pause(conn, call, history, seconds, until), history=history, audited=True
    )


def _pause(
    conn: Connection,
    call: Call,
    history: tuple[str, ...] | None,
    seconds: float | None,
    until: datetime | None,
) -> int:
    from dislock.cli.lock_rows import states
    from dislock.cli.sending import send
    from dislock.core.operator_commands import PAUSED
    from dislock.core.pause import describe_until, pausing
    from dislock.core.rows import lease_key, schedule_key

    table, lock_key, reason = call.table, call.args.lock_key, call.args.reason
    ends = send(conn, pausing(table, lock_key, reason, seconds=seconds, until=until))
    if ends is None:
        return error(f"--until {until} is not in the future (database clock)", EXIT_USAGE)
    audit(conn, call, "pause", lock_key, describe_until(ends))
    why = f" ({reason})" if reason else ""
    # Recorded, so that the slots it covers read as paused rather than missed.
    recorded = record_event(conn, call, history, PAUSED, until=ends)
    print(
        f"paused {lock_key!r} {describe_until(ends)}{why}: every dislock wrapper skips it "
        f"(dislock 0.1.0 wrappers do not know pauses){recorded}"
    )
    if not send(conn, states(table, [schedule_key(lock_key), lease_key(lock_key)])):
        print(f"note: {lock_key!r} has no lock row yet; check its spelling", file=sys.stderr)
    return EXIT_OK
