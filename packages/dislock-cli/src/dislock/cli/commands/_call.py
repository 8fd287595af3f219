"""One ``dislockctl`` invocation as its command sees it, and the connection every
command but ``serve`` runs on, with the one-line errors of a failed statement; and what
the commands share about the run history: whether a key is known at all and the keys
whose runs read their schedule differently (``history``, ``missed``), and the recording
of an operator's command as an event (``rerun``, ``pause``, ``resume``) and in the
audit trail (every operator action)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from dislock.cli import EXIT_FAILURE, EXIT_OK
from dislock.cli.sending import send

if TYPE_CHECKING:
    from psycopg.sql import Composable

    from dislock.cli.sending import Connection
    from dislock.core.exchange import Exchange


PRINT_SQL_HELP = "print the statements instead of running them"


class Call(NamedTuple):
    """The parsed arguments, the environment (``--table`` and ``--history-table``
    written into it), the database URL and the lock table."""

    command: str
    """The command's name (``ls`` for ``status``); ``args.command`` is as typed."""
    args: argparse.Namespace
    env: Mapping[str, str]
    url: str
    table: tuple[str, ...]

    def history_table(self) -> tuple[str, ...]:
        """The run history table (``--history-table``, ``LOCK_HISTORY_TABLE``, or the
        lock table's name with ``_history``); raises ConfigurationError."""
        from dislock.core import variables
        from dislock.core.history import history_table

        return history_table(self.table, variables.HISTORY_TABLE.read(self.env))

    def connected(
        self,
        body: Callable[[Any], int],
        *,
        history: tuple[str, ...] | None = None,
        denied_as: str | None = None,
        on_denied: Callable[[str], str] | None = None,
        audited: bool = False,
    ) -> int:
        """``body(conn)``'s status on a connection to the database; a failed
        statement is one line and exit 1.  A refused one names the privileges the
        role lacks for ``denied_as`` (by default the command) on the lock table and
        ``history`` (``dislock.cli._denied``), unless ``on_denied`` words it from the
        server's scrubbed message.  ``audited``: ``body`` runs in one transaction, so
        that its action and its row of the audit trail (``audit``) commit together."""
        import psycopg
        import psycopg.errors

        from dislock.cli.diagnosis import HISTORY_TABLE, LOCK_TABLE, describe_database_error
        from dislock.cli.far_times import for_reading
        from dislock.core.context import DEFAULT_CONNECT_TIMEOUT
        from dislock.core.dsn import connection_kwargs, one_line, scrub

        url = self.url
        try:
            with psycopg.connect(url, **connection_kwargs(url, DEFAULT_CONNECT_TIMEOUT)) as conn:
                for_reading(conn)
                if not audited:
                    return body(conn)
                with conn.transaction():
                    return body(conn)
        except psycopg.errors.InsufficientPrivilege as exc:
            if on_denied is not None:
                return error(on_denied(scrub(one_line(str(exc)), url)))
            from dislock.cli._denied import explain_denial

            asked, key = denied_as or self.command, getattr(self.args, "lock_key", None)
            tables = {LOCK_TABLE: self.table, HISTORY_TABLE: history or None}
            message = explain_denial(self.args.command, asked, exc, tables=tables, url=url, key=key)
            return error(message)
        except psycopg.Error as exc:
            return error(describe_database_error(exc, table_parts=self.table, url=url))

    def on_history(
        self, history: tuple[str, ...], body: Callable[[Any], int], *, denied_as: str | None = None
    ) -> int:
        """``connected``, for a command that reads the run history table: exit 1 with
        one line saying how to create it when it does not exist."""

        def checked(conn: Connection) -> int:
            if columns(conn, history):
                return body(conn)
            return error(
                f"history table {'.'.join(history)} does not exist: create it with "
                "`dislockctl URL_VARIABLE init --history` and set LOCK_HISTORY=1 on the wrappers"
            )

        return self.connected(checked, history=history, denied_as=denied_as)


def error(message: str, status: int = EXIT_FAILURE) -> int:
    """A command's one line on stderr; ``status``, for the command to exit with."""
    print(f"dislockctl: error: {message}", file=sys.stderr)
    return status


def add_reason_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reason",
        default="",
        help="recorded with it in the audit trail (at most 1000 bytes, one line)",
    )


def audit(
    conn: Connection, call: Call, action: str, lock_key: str | None, detail: str = ""
) -> None:
    """Record ``action`` (with ``--reason``) in the lock table's audit trail
    (``dislock.core.audit_trail``), in the transaction that did it: refused, the
    action is undone.  A table without a trail (``init`` makes it) is not audited."""
    from dislock.core import audit_trail

    if beside(conn, call.table, audit_trail.installed):
        reason = getattr(call.args, "reason", "") or ""
        send(conn, audit_trail.record(call.table, action, lock_key, detail, reason))


def no_row(conn: Connection, table: tuple[str, ...], lock_key: str, modes: Sequence[str]) -> int:
    """Exit 1 for a key without the rows asked for: a typo is not a success; but
    row-level security may be hiding them (``dislock.cli.admin.no_row_text``)."""
    from dislock.cli.admin import no_row_text
    from dislock.cli.diagnosis import row_security

    security = send(conn, row_security(table))
    hidden_from = security.role if security and security.hides(lock_key) else None
    return error(no_row_text(lock_key, modes, table, hidden_from=hidden_from))


def beside(
    conn: Connection, table: tuple[str, ...], installed: Callable[[Any], Exchange[bool]]
) -> bool:
    """Whether what ``installed`` asks about (functions of this version) is beside the
    (existing) table, named with its schema."""
    from dislock.core.grant_catalog import qualified

    found = send(conn, qualified(table))
    return found is not None and send(conn, installed(found))


def in_schema(table: tuple[str, ...]) -> tuple[str, str]:
    """``table`` with its schema, as ``--print-sql`` names it: without one, public's."""
    return table if len(table) == 2 else ("public", table[0])


def print_sql(statements: Iterable[Composable], *, transaction: bool = False) -> int:
    """``--print-sql``: the statements for a DBA (in one transaction, if asked); exit 0."""
    lines = [f"{statement.as_string(None)};" for statement in statements]
    print("\n".join(["BEGIN;", *lines, "COMMIT;"] if transaction else lines))
    return EXIT_OK


def columns(conn: Connection, table: tuple[str, ...]) -> list[str]:
    """The columns of ``table`` (none: it does not exist)."""
    from dislock.cli.lock_rows import columns as columns_of

    return send(conn, columns_of(table))


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text!r}")
    return value


def unknown_key(
    conn: Connection, table: tuple[str, ...], history: tuple[str, ...], key: str
) -> bool:
    """Whether ``key`` has neither a recorded run nor a lock row; if so, says so."""
    from dislock.cli.runs.run_history import known_key

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
