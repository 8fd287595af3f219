"""``dislockctl resume``: end a pause of LOCK_KEY (exit 1 if it was not paused),
recorded in the run history when there is one (``dislock.core.operator_commands``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dislock.cli import EXIT_OK
from dislock.cli.commands._call import (
    Call,
    add_reason_argument,
    audit,
    error,
    record_event,
    recorded_history,
)

if TYPE_CHECKING:
    from dislock.cli.sending import Connection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lock_key", metavar="LOCK_KEY")
    add_reason_argument(parser)


def run(call: Call) -> int:
    history = recorded_history(call)
    return call.connected(lambda conn: _resume(conn, call, history), history=history, audited=True)


def _resume(conn: Connection, call: Call, history: tuple[str, ...] | None) -> int:
    from dislock.cli.sending import send
    from dislock.core.operator_commands import RESUMED
    from dislock.core.pause import resuming

    lock_key = call.args.lock_key
    if not send(conn, resuming(call.table, lock_key)):
        return error(f"{lock_key!r} is not paused")
    audit(conn, call, "resume", lock_key)
    recorded = record_event(conn, call, history, RESUMED)
    print(f"resumed {lock_key!r}: its next start runs{recorded}")
    return EXIT_OK
