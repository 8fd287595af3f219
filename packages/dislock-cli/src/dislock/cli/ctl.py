"""``dislockctl``: look at, create and repair what the ``dislock`` wrapper relies on.

    dislockctl URL_VARIABLE init [--fencing] [--history [--history-table T]] [--max-ttl 1h]
                                 [--print-sql]
    dislockctl URL_VARIABLE ls [PREFIX] [--json]        (also: status)
    dislockctl URL_VARIABLE release LOCK_KEY [--mode schedule|lease|all] [--owner TOKEN]
                                             [--slot N]
    dislockctl URL_VARIABLE pause LOCK_KEY [--for 2h | --until TIME] [--reason TEXT]
    dislockctl URL_VARIABLE resume LOCK_KEY
    dislockctl URL_VARIABLE history [LOCK_KEY] [--since 24h] [--limit N] [--json]
    dislockctl URL_VARIABLE history --prune-older-than 30d
    dislockctl URL_VARIABLE missed LOCK_KEY [--schedule CRON] [--since 24h] [--json]
    dislockctl URL_VARIABLE check
    dislockctl URL_VARIABLE serve [--listen HOST:PORT] [--allow-host NAME ...]
                                  [--max-connections N] [--request-timeout SECONDS]
    dislockctl URL_VARIABLE grant ROLE (--keys PATTERN ... [--operator] | --reader) [--print-sql]
    dislockctl URL_VARIABLE revoke ROLE [--print-sql]
    dislockctl URL_VARIABLE grants [--json]

Like the wrapper, it takes the NAME of the variable holding the database URL and
reads ``LOCK_TABLE`` (or ``--table``) and ``LOCK_HISTORY_TABLE`` (or
``--history-table``); ``check`` reads every wrapper variable.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

from dislock.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, __version__
from dislock.core.kinds import NAMES as MODES

if TYPE_CHECKING:
    from dislock.cli.settings import WrapperSettings


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line and exit 2, like the wrapper
        from dislock.core.bounds import escape  # argparse quotes stray arguments as they are

        self.exit(EXIT_USAGE, f"dislockctl: error: {escape(message)}\n")


def _slot_number(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a slot number (1, 2, ...), got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dislockctl",
        description="Operator commands for dislock's lock table.",
        epilog=(
            "Exit status: 0 done, 1 database failure (also: release/resume of a key with "
            "nothing to act on, missed slots found by missed), 2 bad usage or configuration."
        ),
    )
    parser.add_argument("--version", action="version", version=f"dislockctl {__version__}")
    parser.add_argument(
        "url_variable",
        metavar="URL_VARIABLE",
        help="NAME of the environment variable holding the database URL (e.g. DATABASE_URL)",
    )
    table_help = "lock table, 'table' or 'schema.table' (default: $LOCK_TABLE or key_value)"
    parser.add_argument("--table", help=table_help)
    # Accepted after the command too (`dislockctl DATABASE_URL ls --table ops.locks`).
    table = _Parser(add_help=False)
    table.add_argument("--table", default=argparse.SUPPRESS, help=table_help)
    history_table = _Parser(add_help=False)
    history_table.add_argument(
        "--history-table",
        help="run history table (default: $LOCK_HISTORY_TABLE or <lock table>_history)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    init = commands.add_parser(
        "init", parents=[table], help="create the lock table (and schema) if missing"
    )
    init.add_argument("--fencing", action="store_true", help="add the fencing-token column")
    init.add_argument(
        "--history", action="store_true", help="create the run history table too (LOCK_HISTORY=1)"
    )
    init.add_argument(
        "--history-table", help="its name (default: $LOCK_HISTORY_TABLE or <lock table>_history)"
    )
    init.add_argument(
        "--max-ttl",
        metavar="DURATION",
        help="the longest lease TTL the table accepts, and so the longest lock delay after"
        " a failover (e.g. 1h, 15m, 3600; default: 1h)",
    )
    init.add_argument(
        "--print-sql", action="store_true", help="print the DDL instead of running it"
    )

    listing = commands.add_parser(
        "ls",
        aliases=["status"],
        parents=[table],
        help="list locks: held, released, expired (abandoned), ended slots, paused",
    )
    listing.add_argument("prefix", nargs="?", default="", help="only lock keys starting so")
    listing.add_argument("--json", action="store_true", help="machine-readable output")

    release = commands.add_parser(
        "release",
        parents=[table],
        help="force-expire a stuck schedule slot or lease, saying what it removed",
    )
    release.add_argument("lock_key", metavar="LOCK_KEY")
    release.add_argument("--mode", choices=(*MODES, "all"), default="all")
    release.add_argument(
        "--owner", help="release only if this owner token still holds it (as shown by ls)"
    )
    release.add_argument(
        "--slot",
        type=_slot_number,
        help="release only this slot of an N-holder lease (default: every slot)",
    )

    pause = commands.add_parser(
        "pause",
        parents=[table],
        help="stop every machine from starting LOCK_KEY (they skip it) until resumed",
    )
    pause.add_argument("lock_key", metavar="LOCK_KEY")
    until = pause.add_mutually_exclusive_group()
    until.add_argument("--for", dest="for_", metavar="DURATION", help="e.g. 2h, 30m, 1d")
    until.add_argument("--until", metavar="TIME", help="ISO 8601 time (UTC unless it says)")
    pause.add_argument(
        "--reason",
        default="",
        help="shown by ls and in every skip message (at most 1000 bytes, one line)",
    )
    resume = commands.add_parser("resume", parents=[table], help="end a pause of LOCK_KEY")
    resume.add_argument("lock_key", metavar="LOCK_KEY")

    history = commands.add_parser(
        "history",
        parents=[table, history_table],
        help="recorded runs, newest first: where, how long, outcome (init --history)",
    )
    history.add_argument("lock_key", metavar="LOCK_KEY", nargs="?", help="only this lock key")
    history.add_argument("--since", default="24h", help="how far back (default 24h)")
    history.add_argument(
        "--limit", type=_positive_int, default=100, help="at most N runs (default 100)"
    )
    history.add_argument("--json", action="store_true", help="machine-readable output")
    history.add_argument(
        "--prune-older-than",
        metavar="DURATION",
        help="instead: delete runs that started longer ago than this (e.g. 30d)",
    )

    missed = commands.add_parser(
        "missed",
        parents=[table, history_table],
        help="slots of LOCK_KEY's schedule in which no run started; exit 1 if any",
    )
    missed.add_argument("lock_key", metavar="LOCK_KEY")
    missed.add_argument(
        "--schedule", help="cron expression (default: the one recorded with its runs)"
    )
    missed.add_argument(
        "--tz",
        help="time zone of the schedule (default: the one recorded with its runs, else "
        "$CRON_TZ or the local zone, as the wrapper reads it)",
    )
    missed.add_argument("--since", default="24h", help="how far back (default 24h)")
    missed.add_argument(
        "--grace", default="1m", help="do not judge a slot younger than this (default 1m)"
    )
    missed.add_argument("--json", action="store_true", help="machine-readable output")

    commands.add_parser(
        "check",
        parents=[table],
        help="validate the wrapper's environment and show what it would do, acquiring nothing",
    )

    serve = commands.add_parser(
        "serve",
        parents=[table, history_table],
        help="serve Prometheus metrics (/metrics) and a status page (/), read-only",
    )
    serve.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default="127.0.0.1:9655",
        help="address to listen on (default: 127.0.0.1:9655, this machine only)",
    )
    serve.add_argument(
        "--allow-host",
        metavar="NAME",
        action="append",
        default=[],
        help="also answer requests for this Host name (repeatable; loopback names and "
        "--listen's host are always answered, any other gets 421)",
    )
    serve.add_argument(
        "--max-connections",
        metavar="N",
        type=_positive_int,
        default=32,
        help="connections served at once; more are refused with 503 (default 32)",
    )
    serve.add_argument(
        "--request-timeout",
        metavar="SECONDS",
        default="5",
        help="a client that has not sent its whole request by then is dropped (default 5)",
    )
    granting = commands.add_parser(
        "grant",
        parents=[table, history_table],
        help="let ROLE lock the keys PATTERN matches, and nothing else (row-level security)",
    )
    granting.add_argument("role", metavar="ROLE", help="an existing login role")
    granting.add_argument(
        "--keys",
        metavar="PATTERN",
        action="append",
        default=[],
        help="an exact lock key, or a prefix ending in '*' (repeatable)",
    )
    access = granting.add_mutually_exclusive_group()
    access.add_argument(
        "--operator", action="store_true", help="also pause, resume, release and prune those keys"
    )
    access.add_argument(
        "--reader", action="store_true", help="read every key (ls, history, missed, serve)"
    )
    granting.add_argument(
        "--print-sql", action="store_true", help="print the statements instead of running them"
    )
    revoking = commands.add_parser(
        "revoke", parents=[table, history_table], help="take ROLE's grant away"
    )
    revoking.add_argument("role", metavar="ROLE")
    revoking.add_argument(
        "--print-sql", action="store_true", help="print the statements instead of running them"
    )
    listing_grants = commands.add_parser(
        "grants", parents=[table], help="which role may lock which keys, and the maximum TTL"
    )
    listing_grants.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _max_ttl(text: str | None) -> float | None:
    """``init --max-ttl``: a duration, or plain seconds."""
    if text is None:
        return None
    from dislock.cli.fleet import parse_duration

    stripped = text.strip()
    if stripped.replace(".", "", 1).isdigit():
        stripped += "s"
    return parse_duration(stripped, name="--max-ttl").total_seconds()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    try:
        return _main(argv, environ)
    except BrokenPipeError:
        # `dislockctl ... ls | head`: the reader left; that is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _main(argv: Sequence[str] | None, environ: Mapping[str, str] | None) -> int:
    args = build_parser().parse_args(argv)
    env = os.environ if environ is None else environ

    from dislock.cli.settings import read_database_url, read_table, read_wrapper_settings
    from dislock.core.errors import ConfigurationError

    if args.table is not None:
        env = {**env, "LOCK_TABLE": args.table}  # one source of truth for every command
    if getattr(args, "history_table", None) is not None:
        env = {**env, "LOCK_HISTORY_TABLE": args.history_table}
    try:
        url = read_database_url(args.url_variable, env)
        table = read_table(env)
        settings = (
            read_wrapper_settings(args.url_variable, ["true"], env)
            if args.command == "check"
            else None
        )
        from dislock.core.bounds import check_utf8

        for name, value in (
            ("LOCK_KEY", getattr(args, "lock_key", None)),
            ("PREFIX", getattr(args, "prefix", None)),
            ("--owner", getattr(args, "owner", None)),
            ("--reason", getattr(args, "reason", None)),
        ):
            if value is not None:
                check_utf8(name, value)
        request = _fleet_request(args, table, env)
        max_ttl = _max_ttl(getattr(args, "max_ttl", None))
        if args.command == "grant":
            from dislock.core.grants import OPERATOR, READER, WRAPPER, check_patterns, check_role

            access = READER if args.reader else OPERATOR if args.operator else WRAPPER
            check_role(args.role)
            check_patterns(args.keys, access)
    except ConfigurationError as exc:
        print(f"dislockctl: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    if args.command == "init" and args.print_sql:
        for statement in _init_sql(table, args.fencing, request and request.history, max_ttl):
            print(statement)
        return EXIT_OK

    if args.command == "serve":
        from dislock.cli.serve import serve
        from dislock.cli.settings import read_history_table
        from dislock.core.history import history_table

        try:
            from dislock.cli.http_policy import Limits, request_timeout

            history = history_table(table, read_history_table(env))
            limits = Limits(args.max_connections, request_timeout(args.request_timeout))
        except ConfigurationError as exc:
            print(f"dislockctl: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        return serve(url, table, history, args.listen, args.allow_host, limits)

    import psycopg
    import psycopg.errors

    from dislock.cli.diagnosis import describe_database_error
    from dislock.core.context import DEFAULT_CONNECT_TIMEOUT
    from dislock.core.dsn import connection_kwargs, scrub

    try:
        with psycopg.connect(url, **connection_kwargs(url, DEFAULT_CONNECT_TIMEOUT)) as conn:
            if args.command == "init":
                return _init(conn, table, args.fencing, request and request.history, max_ttl)
            if args.command in ("grant", "revoke", "grants"):
                return _grant_command(conn, args, table, env)
            if args.command in ("ls", "status"):
                return _list(conn, table, args.prefix, args.json)
            if args.command == "release":
                return _release(conn, table, args.lock_key, args.mode, args.owner, args.slot)
            if args.command in ("pause", "resume", "history", "missed"):
                from dislock.cli._fleetctl import run_fleet_command

                return run_fleet_command(conn, args, table, request)
            assert settings is not None
            return _check(conn, settings)
    except psycopg.errors.InsufficientPrivilege as exc:
        if args.command != "init":
            print(f"dislockctl: error: {_denied(args, exc, table, request, url)}", file=sys.stderr)
            return EXIT_FAILURE
        detail = scrub(" ".join(str(exc).split()), url)
        print(
            f"dislockctl: error: this role may not create the lock table ({detail}); run init "
            "as the table's owner, or apply `init --print-sql` through your migrations",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    except psycopg.Error as exc:
        message = describe_database_error(exc, table_parts=table, url=url)
        print(f"dislockctl: error: {message}", file=sys.stderr)
        return EXIT_FAILURE


def _denied(
    args: argparse.Namespace,
    error: BaseException,
    table: tuple[str, ...],
    request: Any,
    url: str,
) -> str:
    """The one line for a statement the role may not run (``dislock.cli._denied``): the
    privileges of the command (``diagnosis.PRIVILEGES``) that the role lacks."""
    from dislock.cli._denied import explain_denial
    from dislock.cli.diagnosis import HISTORY_TABLE, LOCK_TABLE

    command = "ls" if args.command == "status" else args.command
    if command == "history" and request.prune is not None:
        command = "history --prune-older-than"
    tables = {LOCK_TABLE: table, HISTORY_TABLE: (request and request.history) or None}
    return explain_denial(args.command, command, error, tables=tables, url=url)


def _columns(conn: Any, table: tuple[str, ...]) -> list[str]:
    from dislock.cli.admin import columns_query

    query, params = columns_query(table)
    return [str(name) for (name,) in conn.execute(query, params).fetchall()]


def _fleet_request(args: argparse.Namespace, table: tuple[str, ...], env: Mapping[str, str]) -> Any:
    """The validated input of the pause/history/missed commands (and init's history
    table), so that bad input is refused before connecting."""
    from dislock.cli._fleetctl import read_request

    if args.command in ("pause", "resume", "history", "missed") or (
        args.command == "init" and args.history
    ):
        return read_request(args, table, env)
    return None


def _init_sql(
    table: tuple[str, ...],
    fencing: bool,
    history: tuple[str, ...] | None,
    max_ttl: float | None = None,
) -> list[str]:
    from dislock.cli.admin import init_statements
    from dislock.core.history import create_history
    from dislock.core.limits import set_max_ttl

    statements = init_statements(table, fencing=fencing)
    if history is not None:
        statements += create_history(history)
    if max_ttl is not None:
        # On a table with grants, also: dislockctl grant ... --print-sql (the bound).
        statements.append(set_max_ttl(table, max_ttl))
    return [f"{s.as_string(None)};" for s in statements]


def _init(
    conn: Any,
    table: tuple[str, ...],
    fencing: bool,
    history: tuple[str, ...] | None,
    max_ttl: float | None = None,
) -> int:
    from dislock.cli.admin import init_statements
    from dislock.core.history import create_history

    columns = _columns(conn, table)
    history_columns = _columns(conn, history) if history is not None else ["present"]
    if columns and (not fencing or "fence" in columns) and history_columns:
        # Nothing to create: an application role without DDL rights gets here too.
        print(f"lock table {'.'.join(table)} already exists" + (" with fencing" if fencing else ""))
        if history is not None:
            print(f"history table {'.'.join(history)} already exists")
        return _record_max_ttl(conn, table, max_ttl)
    with conn.transaction():
        for statement in init_statements(table, fencing=fencing):
            conn.execute(statement)
        for statement in create_history(history) if history is not None else []:
            conn.execute(statement)
    extra = " with fencing tokens" if fencing else ""
    print(f"lock table {'.'.join(table)} is ready{extra}")
    if history is not None:
        print(f"history table {'.'.join(history)} is ready: set LOCK_HISTORY=1 to record runs")
    return _record_max_ttl(conn, table, max_ttl)


def _record_max_ttl(conn: Any, table: tuple[str, ...], max_ttl: float | None) -> int:
    if max_ttl is None:
        return EXIT_OK
    from dislock.cli.grant_commands import set_table_max_ttl

    with conn.transaction():
        for statement in set_table_max_ttl(conn, table, max_ttl):
            conn.execute(statement)
    print(
        f"maximum lease TTL of {'.'.join(table)}: {max_ttl:g} s"
        " (longer leases are refused; no lock delay after a failover lasts longer)"
    )
    return EXIT_OK


def _grant_command(
    conn: Any, args: argparse.Namespace, table: tuple[str, ...], env: Mapping[str, str]
) -> int:
    from dislock.cli import grant_commands
    from dislock.cli.settings import read_history_table
    from dislock.core.grants import OPERATOR, READER, WRAPPER
    from dislock.core.history import history_table

    if args.command == "grants":
        return grant_commands.list_grants(conn, table, as_json=args.json)
    history = history_table(table, read_history_table(env))
    if args.command == "revoke":
        return grant_commands.revoke(conn, table, history, args.role, print_sql=args.print_sql)
    access = READER if args.reader else OPERATOR if args.operator else WRAPPER
    return grant_commands.grant(
        conn, table, history, args.role, access, args.keys, print_sql=args.print_sql
    )


def _list(conn: Any, table: tuple[str, ...], prefix: str, as_json: bool) -> int:
    from dislock.cli.admin import LockRow, list_params, list_query, render_json, render_table

    rows = [
        LockRow.from_row(row)
        for row in conn.execute(list_query(table), list_params(prefix)).fetchall()
    ]
    if as_json:
        print(render_json(rows))
        return EXIT_OK
    if rows:
        print(render_table(rows))
    else:
        print(f"no locks in {'.'.join(table)}" + (f" starting with {prefix!r}" if prefix else ""))
    print(_table_limits(conn, table))
    return EXIT_OK


def _table_limits(conn: Any, table: tuple[str, ...]) -> str:
    """``ls``'s last line: the table's maximum lease TTL, and a running lock delay."""
    from psycopg import sql

    from dislock.cli.admin import describe_expiry
    from dislock.core.failover import lock_delay_query
    from dislock.core.limits import max_ttl_query

    cap, recorded = conn.execute(max_ttl_query(table)).fetchone()
    line = f"maximum lease TTL {cap:g} s" + ("" if recorded else " (the default)")
    delay = conn.execute(lock_delay_query(sql.Identifier(*table))).fetchone()
    if delay is not None and delay[2] > 0:
        ends = describe_expiry(delay[2])
        line += f"; LOCK DELAY after a failover: nothing is taken until it ends {ends}"
    return line


def _release(
    conn: Any,
    table: tuple[str, ...],
    lock_key: str,
    mode: str,
    owner: str | None,
    slot: int | None = None,
) -> int:
    from dislock.cli.admin import (
        format_duration,
        release_params,
        release_query,
        released_text,
        state_query,
    )
    from dislock.core.bounds import escape
    from dislock.core.kinds import parse_row_key

    modes = (
        ("lease",) if slot is not None and mode == "all" else MODES if mode == "all" else (mode,)
    )
    params = release_params(table, lock_key, modes, slot=slot, owner=owner)
    released = conn.execute(release_query(table), params).fetchall()
    if not released:
        if not conn.execute(state_query(table), {"keys": params["keys"]}).fetchall():
            # A typo is not a success.
            print(
                f"dislockctl: error: no {' or '.join(modes)} lock row for {lock_key!r} "
                f"in {'.'.join(table)} (see dislockctl ls)",
                file=sys.stderr,
            )
            return EXIT_FAILURE
        held_by = f" by {escape(owner)}" if owner else ""
        which = f"slot {slot} of the lease" if slot is not None else " or ".join(modes)
        print(f"nothing to release: no {which} lock on {lock_key!r} is held{held_by}")
        return EXIT_OK
    for key, value, remaining, _ in released:
        found, _, number = parse_row_key(key)
        what = "?" if found is None else found.name
        label = f"{what} slot {number}" if number > 1 or slot is not None else what
        print(
            f"released {label} {lock_key!r} held by {escape(value)} "
            f"({format_duration(remaining)} were left); {released_text(what)}"
        )
    return EXIT_OK


def _check(conn: Any, settings: WrapperSettings) -> int:
    from psycopg import sql

    from dislock.cli.admin import describe_expiry, format_duration, state_query
    from dislock.core.bounds import escape
    from dislock.core.cron import next_fires, slot_end
    from dislock.core.kinds import kind
    from dislock.core.lease import LeaseClock, LeaseSettings
    from dislock.core.sql import pause_key

    context = settings.context
    table_parts = tuple(context.table_parts)
    refusal = _refuses_writes(conn)
    if refusal:
        print(f"dislockctl: error: {refusal}", file=sys.stderr)
        return EXIT_FAILURE
    columns = _columns(conn, table_parts)
    missing = {"key", "value", "expire_at", *(["fence"] if context.fencing else [])} - set(columns)
    if not columns or missing:
        # Let the usual diagnosis explain it, as the wrapper would meet it.
        conn.execute(state_query(table_parts), {"keys": []})
        conn.execute(
            sql.SQL("SELECT {} FROM {} LIMIT 0").format(
                sql.SQL(", ").join(sql.Identifier(name) for name in sorted(missing)),
                sql.Identifier(*table_parts),
            )
        )
    table = ".".join(table_parts)
    now: datetime = conn.execute("SELECT NOW()").fetchone()[0]
    print("configuration is valid")
    print(f"  lock key        {escape(context.lock_key)}")
    print(f"  strategies      {','.join(settings.strategies)}")
    print(f"  table           {table}")
    if context.schedule is not None and settings.cron_zone is not None:
        zone = settings.cron_zone
        boundary = slot_end(context.schedule, now, zone.tz)
        print(f"  schedule        {context.schedule}")
        print(f"  time zone       {zone.name} (from {zone.source})")
        local = boundary.astimezone(zone.tz).isoformat()
        print(f"  slot ends       {boundary.isoformat()} (database clock, UTC; {local} local)")
        # Read from the fires, a schedule meant for another field order shows at once.
        for number, fire in enumerate(next_fires(context.schedule, now, zone.tz)):
            label = "next fires" if number == 0 else ""
            print(f"  {label:<15} {fire.astimezone(zone.tz).isoformat()}")
    if "lease" in settings.strategies:
        lease = LeaseSettings.from_context(context)
        cadence = LeaseClock(lease, acquired_at=0.0).cadence
        print(f"  lease TTL       {lease.ttl:g} s")
        heartbeat = f"  heartbeat       {lease.interval:g} s"
        if cadence < lease.interval:
            heartbeat += f" (renews every {cadence:g} s to stay ahead of its deadline)"
        print(heartbeat)
        print(f"  on lease loss   {lease.policy.value}")
    print(f"  startup jitter  up to {context.jitter_max_seconds:g} s")
    if context.wait_seconds > 0:
        how = {
            None: "LISTEN on a direct connection, else polling",
            True: "LISTEN",
            False: "polling",
        }
        print(
            f"  wait            up to {context.wait_seconds:g} s"
            f" ({how[context.wait_listen]}; polls every {context.wait_poll_seconds:g} s)"
        )
    if context.slots > 1:
        print(f"  slots           {context.slots} holders at once")
    if settings.conflict_exit_code:
        print(f"  when held       exit {settings.conflict_exit_code}")
    print(f"  fencing         {'on' if context.fencing else 'off'}")
    if context.history:
        from dislock.core.history import history_table

        runs = history_table(table_parts, context.history_table)
        state = (
            ""
            if _columns(conn, runs)
            else " (MISSING: dislockctl init --history; runs log a warning)"
        )
        print(f"  history         {'.'.join(runs)}{state}")
    else:
        print("  history         off")
    print(f"  database now    {now.isoformat()}")
    if _print_max_ttl(conn, table_parts, settings) is not None:
        return EXIT_USAGE
    _print_lock_delay(conn, table_parts)
    slots = {name: context.slots if kind(name).renewed else 1 for name in settings.strategies}
    keys = {
        name: [kind(name).row_key(context.lock_key, n) for n in range(1, slots[name] + 1)]
        for name in settings.strategies
    }
    paused = pause_key(context.lock_key)
    found = dict(
        (key, (owner, remaining))
        for key, owner, remaining in conn.execute(
            state_query(table_parts),
            {"keys": [paused, *(key for group in keys.values() for key in group)]},
        ).fetchall()
    )
    busy = "wait" if context.wait_seconds > 0 else "skip"
    print("lock state")
    reason, left = found.get(paused, ("", 0.0))
    if left > 0:
        why = f": {reason}" if reason else ""
        span = "until resumed" if left > 100 * 365 * 86400 else f"for {format_duration(left)}"
        print(f"  paused          {span}{why}: a run now would skip")
    for strategy in settings.strategies:
        held = [found[key] for key in keys[strategy] if key in found and found[key][1] > 0]
        if slots[strategy] > 1:
            state = f"{len(held)}/{slots[strategy]} slots held: a run now would " + (
                busy if len(held) == slots[strategy] else "take one"
            )
        elif not held:
            state = "free: a run now would take it"
        else:
            owner, remaining = held[0]
            expires = describe_expiry(remaining)
            state = f"held by {escape(owner)}, expires {expires}: a run now would {busy}"
        print(f"  {strategy:<14}  {state}")
    return EXIT_OK


def _refuses_writes(conn: Any) -> str | None:
    """Why this session cannot take locks (a standby, a read-only session), or None."""
    from dislock.cli.admin import WRITABLE_QUERY, read_only_reason

    in_recovery, read_only = conn.execute(WRITABLE_QUERY).fetchone()
    return read_only_reason(in_recovery=in_recovery, read_only=read_only)


def _print_max_ttl(
    conn: Any, table: tuple[str, ...], settings: WrapperSettings | None
) -> str | None:
    """The table's maximum lease TTL; the refusal when the configured lease exceeds it."""
    from dislock.core.lease import LeaseSettings
    from dislock.core.limits import max_ttl_query, too_long

    cap, recorded = conn.execute(max_ttl_query(table)).fetchone()
    print(f"  max lease TTL   {cap:g} s" + ("" if recorded else " (the default)"))
    if settings is None or "lease" not in settings.strategies:
        return None
    ttl = LeaseSettings.from_context(settings.context).ttl
    if ttl <= cap:
        return None
    refusal = too_long(ttl, cap)
    print(f"dislockctl: error: RUN_LOCK_TTL_SECONDS: {refusal}", file=sys.stderr)
    return refusal


def _print_lock_delay(conn: Any, table: tuple[str, ...]) -> None:
    """The server timeline and the lock delay after a failover (dislock.core.failover)."""
    from psycopg import sql

    from dislock.cli.admin import describe_expiry
    from dislock.core.failover import lock_delay_query

    row = conn.execute(lock_delay_query(sql.Identifier(*table))).fetchone()
    if row is None:
        print("  timeline        not recorded yet (the first lock taken records it)")
        return
    recorded, _, remaining, current = row
    line = f"  timeline        {current}"
    if recorded != current:
        line += f" (recorded {recorded}: the next lock taken starts a lock delay after failover)"
    elif remaining > 0:
        line += (
            f"; lock delay after failover: no takeover until it ends {describe_expiry(remaining)}"
        )
    print(line)


def console_main() -> NoReturn:
    """The ``dislockctl`` console script (and ``python -m dislock.cli.ctl``): :func:`main`,
    then an exit that skips the interpreter's teardown (see ``dislock.cli._exit``)."""
    status = main()
    from dislock.cli._exit import exit_now

    exit_now(status)


if __name__ == "__main__":
    console_main()
