"""``dislockctl init``: create the lock table (and its schema), the run history
table with ``--history``, and record the table's maximum lease TTL; or print the
statements for a migration (``--print-sql``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from dislock.cli import EXIT_OK
from dislock.cli.commands._call import (
    Call,
    add_reason_argument,
    beside,
    columns,
    error,
    in_schema,
)
from dislock.cli.sending import send
from dislock.cli.table_change import add_wait_argument, patience_of

if TYPE_CHECKING:
    from psycopg import sql

    from dislock.cli.sending import Connection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fencing",
        action="store_true",
        help="add the fencing-token column and the guard that `dislockctl fence` attaches",
    )
    parser.add_argument(
        "--history", action="store_true", help="create the run history table too (LOCK_HISTORY=1)"
    )
    parser.add_argument(
        "--history-table", help="its name (default: $LOCK_HISTORY_TABLE or <lock table>_history)"
    )
    parser.add_argument(
        "--max-ttl",
        metavar="DURATION",
        help="the longest lease TTL the table accepts, and so the longest lock delay after"
        " a failover (e.g. 1h, 15m, 3600; default: 1h)",
    )
    parser.add_argument(
        "--print-sql", action="store_true", help="print the DDL instead of running it"
    )
    add_wait_argument(parser)
    add_reason_argument(parser)


def run(call: Call) -> int:
    from dislock.cli.time_args import parse_seconds

    args, table = call.args, call.table
    history = call.history_table() if args.history else None
    max_ttl = None if args.max_ttl is None else parse_seconds(args.max_ttl, name="--max-ttl")
    patience = patience_of(args)
    if args.print_sql:
        from dislock.core.limits import set_max_ttl

        statements = list(_creating(table, args.fencing, history, in_schema))
        if max_ttl is not None:
            # On a table with grants, also: dislockctl grant ... --print-sql (the bound).
            statements.append(set_max_ttl(table, max_ttl))
        for statement in statements:
            print(f"{statement.as_string(None).rstrip().removesuffix(';')};")
        return EXIT_OK
    grants_history = call.history_table()
    return call.connected(
        lambda conn: (
            _init(conn, call, history, max_ttl, patience)
            or _upgrade_grants(conn, table, grants_history, patience)
        ),
        on_denied=lambda detail: (
            f"this role may not create the lock table ({detail}); run init as the table's"
            " owner, or apply `init --print-sql` through your migrations"
        ),
    )


def _creating(
    table: tuple[str, ...],
    fencing: bool,
    history: tuple[str, ...] | None,
    schema_of: Callable[[tuple[str, ...]], tuple[str, str]],
) -> Iterator[sql.Composed]:
    """What ``init`` runs, in order.  The functions name the tables with their schemas
    (``schema_of``), asked for once the tables exist: this is a generator."""
    from dislock.cli.admin import init_statements
    from dislock.core.audit_trail import create_audit
    from dislock.core.history import create_history
    from dislock.core.protocol import protocol_sql

    yield from init_statements(table, fencing=fencing)
    schema_table = schema_of(table)
    yield protocol_sql(schema_table)
    yield create_audit(schema_table)
    if fencing:
        from dislock.core.fencing import guard_sql

        yield guard_sql(schema_table)
    if history is not None:
        from dislock.core.history_functions import history_functions_sql

        yield from create_history(history)
        yield history_functions_sql(schema_of(history), schema_table)


def _init(
    conn: Connection,
    call: Call,
    history: tuple[str, ...] | None,
    max_ttl: float | None,
    patience: float,
) -> int:
    from dislock.cli.table_change import TableBusy, change
    from dislock.core import audit_trail, history_functions, protocol
    from dislock.core import fencing as guard
    from dislock.core.grant_catalog import qualified
    from dislock.core.history import up_to_date

    table, fencing = call.table, call.args.fencing
    found = columns(conn, table)
    history_ready = history is None or (
        bool(columns(conn, history))
        and send(conn, up_to_date(history))
        and beside(conn, history, history_functions.installed)
    )
    guarded = not fencing or ("fence" in found and beside(conn, table, guard.guard_installed))
    functions = beside(conn, table, protocol.installed) and beside(
        conn, table, audit_trail.installed
    )
    if found and guarded and history_ready and (functions or not _owns(conn, table)):
        # Nothing to create: an application role without DDL rights gets here too.
        print(f"lock table {'.'.join(table)} already exists" + (" with fencing" if fencing else ""))
        if not functions:
            print(
                "  (without the lock functions: plain statements are sent; init as the"
                " table's owner adds them)"
            )
        if history is not None:
            print(f"history table {'.'.join(history)} already exists")
        return _record_max_ttl(conn, table, max_ttl)

    def create(conn: Connection) -> None:
        def schema_of(created: tuple[str, ...]) -> tuple[str, str]:
            return send(conn, qualified(created)) or ("public", created[-1])

        for statement in _creating(table, fencing, history, schema_of):
            conn.execute(statement)
        _audit_init(conn, call, schema_of(table))

    # A table in use may get its fencing column here: in short tries, as grant does.
    try:
        change(conn, "init", [table], create, patience=patience)
    except TableBusy as busy:
        return error(str(busy))
    extra = " with fencing tokens" if fencing else ""
    print(f"lock table {'.'.join(table)} is ready{extra}")
    if history is not None:
        print(f"history table {'.'.join(history)} is ready: set LOCK_HISTORY=1 to record runs")
    return _record_max_ttl(conn, table, max_ttl)


def _audit_init(conn: Connection, call: Call, table: tuple[str, str]) -> None:
    """The trail's readers (grants made before it) read it, and the init is its row."""
    from dislock.core import audit_trail
    from dislock.core.grant_catalog import grants_on
    from dislock.core.grant_policies import trail_statements
    from dislock.core.grants import READER

    for reader in [g for g in send(conn, grants_on(table)) if g.access == READER]:
        for statement in trail_statements(audit_trail.audit_table(table), reader.role, READER):
            conn.execute(statement)
    detail = " ".join(f"--{flag}" for flag in ("fencing", "history") if getattr(call.args, flag))
    send(conn, audit_trail.record(table, "init", None, detail, call.args.reason))


def _upgrade_grants(
    conn: Connection, table: tuple[str, ...], history: tuple[str, ...], patience: float
) -> int:
    """Write each grant made before the lock functions again, as it was (its role then
    writes through them): a second ``init`` finds none to write."""
    from dislock.cli.commands import _granting
    from dislock.core.grant_catalog import grants_on

    for old in [g for g in send(conn, grants_on(table)) if not g.current]:
        status = _granting.grant(
            conn,
            table,
            history,
            old.role,
            old.access,
            list(old.keys),
            print_sql=False,
            patience=patience,
            max_keys=old.max_keys or 0,
            plain_writes=old.plain_writes,
        )
        if status != EXIT_OK:
            return status
    return EXIT_OK


def _owns(conn: Connection, table: tuple[str, ...]) -> bool:
    """Whether this role may act as the (existing) table's owner: install its functions."""
    row = conn.execute(
        "SELECT pg_has_role(c.relowner, 'MEMBER') FROM pg_class AS c WHERE c.oid = to_regclass(%s)",
        (".".join(f'"{part}"' for part in table),),
    ).fetchone()
    return bool(row and row[0])


def _record_max_ttl(conn: Connection, table: tuple[str, ...], max_ttl: float | None) -> int:
    """Make ``max_ttl`` the table's maximum TTL: its metadata row, and the bound every
    granted role is held to, where row-level security is on."""
    if max_ttl is None:
        return EXIT_OK
    from dislock.core.grant_catalog import qualified, secured
    from dislock.core.limits import set_max_ttl
    from dislock.core.policy_functions import policy_functions

    with conn.transaction():
        conn.execute(set_max_ttl(table, max_ttl))
        if send(conn, secured(table)):
            found = send(conn, qualified(table))
            for statement in policy_functions(found or table, max_ttl):
                conn.execute(statement)
    print(
        f"maximum lease TTL of {'.'.join(table)}: {max_ttl:g} s"
        " (longer leases are refused; no lock delay after a failover lasts longer)"
    )
    return EXIT_OK
