"""``dislockctl grant``: let ROLE lock the keys its patterns match and nothing else
(``--operator``: also pause, resume, release and prune them; ``--reader``: read
every key), through row-level security (``dislock.core.grant_policies``)."""

from __future__ import annotations

import argparse

from dislock.cli.commands._call import PRINT_SQL_HELP, Call, add_reason_argument
from dislock.cli.table_change import add_wait_argument, patience_of
from dislock.core.history_functions import DEFAULT_MAX_HISTORY_MIB
from dislock.core.key_quota import DEFAULT_MAX_KEYS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("role", metavar="ROLE", help="an existing login role")
    parser.add_argument(
        "--keys",
        metavar="PATTERN",
        action="append",
        default=[],
        help="an exact lock key, or a prefix ending in '*' (repeatable)",
    )
    access = parser.add_mutually_exclusive_group()
    access.add_argument(
        "--operator", action="store_true", help="also pause, resume, release and prune those keys"
    )
    access.add_argument(
        "--reader", action="store_true", help="read every key (ls, history, missed, serve)"
    )
    parser.add_argument(
        "--max-keys",
        metavar="N",
        type=_count,
        default=None,
        help=f"the most lock keys the role may hold (default {DEFAULT_MAX_KEYS} for a wrapper,"
        " no limit for an operator; 0: no limit)",
    )
    parser.add_argument(
        "--max-history-mib",
        metavar="N",
        type=_count,
        default=None,
        help=f"the most MiB its runs' history may hold, output tails included (default"
        f" {DEFAULT_MAX_HISTORY_MIB}; 0: no limit); past it, runs are recorded without tails",
    )
    parser.add_argument(
        "--plain-writes",
        action="store_true",
        help="also let the role write the lock table itself, held to its keys by row-level"
        " security, as machines still on dislock 0.1.0 need (docs/migrating.md)",
    )
    parser.add_argument("--print-sql", action="store_true", help=PRINT_SQL_HELP)
    add_reason_argument(parser)
    add_wait_argument(parser)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of keys (0: no limit)")
    return value


def run(call: Call) -> int:
    from dislock.cli.commands import _granting as grant_commands
    from dislock.core.grants import OPERATOR, READER, WRAPPER, check_patterns, check_role

    args = call.args
    access = READER if args.reader else OPERATOR if args.operator else WRAPPER
    check_role(args.role)
    check_patterns(args.keys, access)
    history = call.history_table()
    patience = patience_of(args)
    return call.connected(
        lambda conn: grant_commands.grant(
            conn,
            call.table,
            history,
            args.role,
            access,
            args.keys,
            print_sql=args.print_sql,
            patience=patience,
            max_keys=args.max_keys,
            plain_writes=args.plain_writes,
            max_history_mib=args.max_history_mib,
            reason=args.reason,
        )
    )
