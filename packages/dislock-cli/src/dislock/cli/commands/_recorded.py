"""What the commands share about the run history: whether a key is known at all
and the keys whose runs read their schedule differently (``history``, ``missed``),
and the recording of an operator's command as an event (``rerun``, ``pause``,
``resume``)."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from dislock.cli.commands._call import Call, error

if TYPE_CHECKING:
    from dislock.cli.sending import Connection


def unknown_key(
    conn: Connection, table: tuple[str, ...], history: tuple[str, ...], key: str
) -> bool:
    """Whether ``key`` has neither a recorded run nor a lock row; if so, says so."""
    from dislock.cli.runs.run_history import known_key
    from dislock.cli.sending import send

    if send(conn, known_key(history, table, key)):
        return False
    error(f"no run of {key!r} is recorded in {'.'.join(history)} and it has no lock row")
    return True


def warn_disagreements(
    conn: Connection, history: tuple[str, ...], since: timedelta, key: str | None
) -> list[Any]:
    """Warn (on stderr, so that --json output stays clean) about keys whose runs
    read their schedule in different zones or expressions; returns the readings of
    ``key`` (all of them, for --json)."""
    from dislock.cli.admin import DATABASE_NOW
    from dislock.cli.runs.run_history import describe_disagreement, disagreements, readings_of
    from dislock.cli.sending import send
    from dislock.core.bounds import escape

    now = send(conn, DATABASE_NOW)
    readings = send(conn, readings_of(history, now - since, key))
    for found_key, found in disagreements(readings).items():
        print(f"dislockctl: {escape(describe_disagreement(found_key, found))}", file=sys.stderr)
    return readings


def check_key_and_reason(call: Call) -> argparse.Namespace:
    """The arguments of ``pause`` and ``rerun``, their key and ``--reason`` checked."""
    from dislock.core.bounds import check_reason, check_text

    check_text("LOCK_KEY", call.args.lock_key)
    check_reason("--reason", call.args.reason)
    return call.args


def recorded_history(call: Call) -> tuple[str, ...] | None:
    """The history table an operator's command is recorded in; None, with a warning,
    when its name is wrong: a pause must not wait for a fixed variable."""
    from dislock.core.errors import ConfigurationError

    try:
        return call.history_table()
    except ConfigurationError as exc:
        print(f"dislockctl: warning: {exc}; not recording this in the run history", file=sys.stderr)
        return None


def record_event(
    conn: Connection,
    call: Call,
    history: tuple[str, ...] | None,
    outcome: str,
    *,
    until: datetime | None = None,
) -> str:
    """Record the operator's command (its key and ``--reason``) in the run history,
    if there is one, both statements in one transaction (a refused end must leave no
    row that reads as a run still going): what the command's summary line adds.  The
    command has done its work whatever happens here; a refusal is a warning."""
    import os
    import socket

    import psycopg

    from dislock.cli.commands._call import columns
    from dislock.cli.sending import send
    from dislock.core import operator_commands
    from dislock.core.dsn import one_line, scrub

    if history is None:
        return ""
    where = ".".join(history)
    try:
        if not columns(conn, history):
            return ""
        with conn.transaction():
            start = operator_commands.record_start(
                history,
                call.args.lock_key,
                outcome,
                reason=getattr(call.args, "reason", ""),
                host=socket.gethostname(),
                pid=os.getpid(),
                until=until,
            )
            send(conn, operator_commands.record_end(history, send(conn, start), outcome))
    except psycopg.Error as exc:
        detail = scrub(one_line(str(exc)), call.url)
        print(
            f"dislockctl: warning: the {operator_commands.OUTCOME_VERBS[outcome]} is not"
            f" recorded in {where}: {detail}",
            file=sys.stderr,
        )
        return f"; not recorded in {where}"
    return f"; recorded in {where}"
