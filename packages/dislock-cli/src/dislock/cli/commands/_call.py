"""One ``dislockctl`` invocation as its command sees it, and the connection every
command but ``serve`` runs on, with the one-line errors of a failed statement."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from dislock.cli import EXIT_FAILURE, EXIT_OK

if TYPE_CHECKING:
    from psycopg.sql import Composable

    from dislock.cli.sending import Connection
    from dislock.core.exchange import Exchange


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
    ) -> int:
        """``body(conn)``'s status on a connection to the database; a failed
        statement is one line and exit 1.  A refused one names the privileges the
        role lacks for ``denied_as`` (by default the command) on the lock table and
        ``history`` (``dislock.cli._denied``), unless ``on_denied`` words it from the
        server's scrubbed message."""
        import psycopg
        import psycopg.errors

        from dislock.cli.diagnosis import describe_database_error
        from dislock.core.context import DEFAULT_CONNECT_TIMEOUT
        from dislock.core.dsn import connection_kwargs, one_line, scrub

        url = self.url
        try:
            with psycopg.connect(url, **connection_kwargs(url, DEFAULT_CONNECT_TIMEOUT)) as conn:
                return body(conn)
        except psycopg.errors.InsufficientPrivilege as exc:
            if on_denied is not None:
                message = on_denied(scrub(one_line(str(exc)), url))
            else:
                message = self._denied(exc, history, denied_as or self.command)
            return error(message)
        except psycopg.Error as exc:
            return error(describe_database_error(exc, table_parts=self.table, url=self.url))

    def on_history(
        self,
        history: tuple[str, ...],
        body: Callable[[Any], int],
        *,
        denied_as: str | None = None,
    ) -> int:
        """``connected``, for a command that reads the run history table: exit 1 with
        one line saying how to create it when it does not exist."""

        def checked(conn: Connection) -> int:
            return body(conn) if history_exists(conn, history) else EXIT_FAILURE

        return self.connected(checked, history=history, denied_as=denied_as)

    def _denied(self, exc: BaseException, history: tuple[str, ...] | None, command: str) -> str:
        from dislock.cli._denied import explain_denial
        from dislock.cli.diagnosis import HISTORY_TABLE, LOCK_TABLE

        tables = {LOCK_TABLE: self.table, HISTORY_TABLE: history or None}
        key = getattr(self.args, "lock_key", None)
        return explain_denial(self.args.command, command, exc, tables=tables, url=self.url, key=key)


def error(message: str, status: int = EXIT_FAILURE) -> int:
    """A command's one line on stderr; ``status``, for the command to exit with."""
    print(f"dislockctl: error: {message}", file=sys.stderr)
    return status


def no_row(conn: Connection, table: tuple[str, ...], lock_key: str, modes: Sequence[str]) -> int:
    """Exit 1 for a key without the rows asked for: a typo is not a success; but
    row-level security may be hiding them (``dislock.cli.admin.no_row_text``)."""
    from dislock.cli.admin import no_row_text
    from dislock.cli.diagnosis import row_security
    from dislock.cli.sending import send

    security = send(conn, row_security(table))
    hidden_from = security.role if security and security.hides(lock_key) else None
    return error(no_row_text(lock_key, modes, table, hidden_from=hidden_from))


def beside(
    conn: Connection, table: tuple[str, ...], installed: Callable[[Any], Exchange[bool]]
) -> bool:
    """Whether what ``installed`` asks about (functions of this version) is beside the
    (existing) table, named with its schema."""
    from dislock.cli.sending import send
    from dislock.core.grant_catalog import qualified

    found = send(conn, qualified(table))
    return found is not None and send(conn, installed(found))


def print_sql(statements: Iterable[Composable], *, transaction: bool = False) -> int:
    """``--print-sql``: the statements for a DBA (in one transaction, if asked); exit 0."""
    lines = [f"{statement.as_string(None)};" for statement in statements]
    print("\n".join(["BEGIN;", *lines, "COMMIT;"] if transaction else lines))
    return EXIT_OK


def columns(conn: Connection, table: tuple[str, ...]) -> list[str]:
    """The columns of ``table`` (none: it does not exist)."""
    from dislock.cli.lock_rows import columns as columns_of
    from dislock.cli.sending import send

    return send(conn, columns_of(table))


def history_exists(conn: Connection, history: tuple[str, ...]) -> bool:
    """Whether the history table exists; if not, says how to create it."""
    if columns(conn, history):
        return True
    error(
        f"history table {'.'.join(history)} does not exist: create it with "
        "`dislockctl URL_VARIABLE init --history` and set LOCK_HISTORY=1 on the wrappers"
    )
    return False


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text!r}")
    return value
