"""``dislockctl rerun``: open LOCK_KEY's current schedule slot for one more run, taken by
the next wrapper that starts on any machine (``dislock.core.retries``); recorded in the
run history, when there is one, with the operator's role and reason.  Refused (unless
``--force``) when the slot ends too soon for a run: in under a minute, or under the
median of its key's envelope (``dislock.cli.runs.envelope``)."""

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
    parser.add_argument(
        "--force",
        action="store_true",
        help="reopen it even when the slot ends in less than a minute or the key's usual runtime",
    )


SHORTEST_SECONDS = 60.0
"""Less of a slot left than this (or the key's median runtime) is refused without --force."""


def run(call: Call) -> int:
    check_key_and_reason(call)
    history = call.history_table()
    return call.connected(lambda conn: _rerun(conn, call, history), history=history, audited=True)


def _rerun(conn: Connection, call: Call, history: tuple[str, ...]) -> int:
    import psycopg

    from dislock.cli.admin import format_duration
    from dislock.cli.runs.history_report import format_time
    from dislock.cli.sending import send
    from dislock.core import operator_commands, retries
    from dislock.core.bounds import clip

    lock_key = call.args.lock_key
    needed, usual = _needed(conn, history, lock_key)
    with conn.transaction() as reopening:
        done = send(conn, retries.rerun(call.table, lock_key))
        if done.reopened:
            assert done.value is not None and done.expire_at is not None
            slot_end = retries.slot_end_of(done.value, done.expire_at)
            left = (slot_end - done.now).total_seconds()
            if left < needed and not call.args.force:
                # The reopening is undone: no tick may come before the slot ends.
                raise psycopg.Rollback(reopening)
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
    assert done.value is not None
    ends = f"ends {format_time(slot_end)} UTC, in {format_duration(max(0.0, left))}"
    if left < needed and not call.args.force:
        return error(
            f"not reopened: the slot of {lock_key!r} {ends}, less than {usual}, too soon for"
            " a run; --force reopens it anyway"
        )
    audit(conn, call, "rerun", lock_key, f"slot ending {slot_end.isoformat()}")
    # With the slot it reopened, which is judged from the attempts after it.
    recorded = record_event(conn, call, history, operator_commands.RERUN, until=slot_end)
    print(
        f"reopened the slot of {lock_key!r} that {ends} (it was {clip(done.value)}): the next"
        f" wrapper to start before then, on any machine, runs it{recorded}"
    )
    return EXIT_OK


def _needed(conn: Connection, history: tuple[str, ...], lock_key: str) -> tuple[float, str]:
    """The least of a slot a rerun needs left, and what it is in words: a minute, or
    the median of the key's envelope when its history knows one and it is longer."""
    import psycopg.errors

    from dislock.cli.admin import format_duration
    from dislock.cli.commands._call import columns
    from dislock.cli.runs.envelope import successes_before
    from dislock.cli.sending import send

    envelope = None
    try:
        # A savepoint: the refusal must not abort the audited transaction around it.
        with conn.transaction():
            if columns(conn, history):
                (envelope,) = send(conn, successes_before(history, [(lock_key, None)]))
    except psycopg.errors.InsufficientPrivilege:
        pass  # a role that may rerun but not read the runs: their runtime is not known
    if envelope is None or envelope.median <= SHORTEST_SECONDS:
        return SHORTEST_SECONDS, "a minute"
    return envelope.median, f"its usual runtime ({format_duration(envelope.median)}, the median)"
