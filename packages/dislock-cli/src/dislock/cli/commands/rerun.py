"""``dislockctl rerun``: open LOCK_KEY's current schedule slot for one more run, taken by
the next wrapper that starts on any machine (``dislock.core.retries``); recorded in the
run history, when there is one, with the operator's role and reason."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dislock.cli import EXIT_OK
from dislock.cli.commands._call import (
    Call,
    audit,
    check_key_and_reason,
    error,
    no_row,
    record_event,
)

if TYPE_CHECKING:
    from dislock.cli.sending import Connection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lock_key", metavar="LOCK_KEY")
    parser.add_argument(
        "--reason",
        default="",
        help="recorded with the rerun in the run history (at most 1000 bytes, one line)",
    )


def run(call: Call) -> int:
    check_key_and_reason(call)
    history = call.history_table()
    return call.connected(lambda conn: _rerun(conn, call, history), history=history, audited=True)


def _rerun(conn: Connection, call: Call, history: tuple[str, ...]) -> int:
    from dislock.cli.runs.history_report import format_time
    from dislock.cli.sending import send
    from dislock.core import operator_commands, retries
    from dislock.core.bounds import clip

    lock_key = call.args.lock_key
    done = send(conn, retries.rerun(call.table, lock_key))
    if done.leased_by is not None:
        return error(
            f"a run of {lock_key!r} is still going (its lease is held by {clip(done.leased_by)}):"
            " rerun it once that run has ended"
        )
    if not done.reopened:
        if done.value is None:
            return no_row(conn, call.table, lock_key, ("schedule",))
        print(
            f"nothing to reopen: the current slot of {lock_key!r} is open (not started, or its"
            " row expired); the next wrapper to start runs it"
        )
        return EXIT_OK
    assert done.value is not None and done.expire_at is not None
    slot_end = retries.slot_end_of(done.value, done.expire_at)
    audit(conn, call, "rerun", lock_key, f"slot ending {slot_end.isoformat()}")
    # With the slot it reopened, which is judged from the attempts after it.
    recorded = record_event(conn, call, history, operator_commands.RERUN, until=slot_end)
    print(
        f"reopened the slot of {lock_key!r} that ends {format_time(slot_end)} UTC"
        f" (it was {clip(done.value)}): the next wrapper to start, on any machine, runs"
        f" it{recorded}"
    )
    return EXIT_OK
