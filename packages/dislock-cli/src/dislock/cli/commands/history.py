"""``dislockctl history``: recorded runs, newest first (where, how long, how they
ended); or, with ``--prune-older-than``, delete the old ones."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import TYPE_CHECKING

from dislock.cli import EXIT_FAILURE, EXIT_OK
from dislock.cli.commands._call import Call, positive_int, unknown_key, warn_disagreements
from dislock.cli.sending import send

if TYPE_CHECKING:
    from dislock.cli.sending import Connection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lock_key", metavar="LOCK_KEY", nargs="?", help="only this lock key")
    parser.add_argument("--since", default="24h", help="how far back (default 24h)")
    parser.add_argument(
        "--limit", type=positive_int, default=100, help="at most N runs (default 100)"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='machine-readable output (a text over 4096 characters is cut: "truncated": true)',
    )
    parser.add_argument(
        "--prune-older-than",
        metavar="DURATION",
        help="instead: delete runs that started longer ago than this (e.g. 30d)",
    )


def run(call: Call) -> int:
    from dislock.cli.time_args import parse_duration
    from dislock.core.errors import ConfigurationError

    args = call.args
    history = call.history_table()
    if args.prune_older_than is not None:
        if args.lock_key is not None:
            raise ConfigurationError("--prune-older-than prunes every key: drop LOCK_KEY")
        older = parse_duration(args.prune_older_than, name="--prune-older-than")
        return call.on_history(
            history,
            lambda conn: _prune(conn, history, older, call.table),
            denied_as="history --prune-older-than",
        )
    since = parse_duration(args.since, name="--since")
    return call.on_history(history, lambda conn: _history(conn, call, history, since))


def _prune(
    conn: Connection, history: tuple[str, ...], older: timedelta, table: tuple[str, ...]
) -> int:
    from dislock.cli.admin import format_duration
    from dislock.cli.runs.run_history import counts_budgets, prune

    count = send(conn, prune(history, older, table if send(conn, counts_budgets(table)) else None))
    print(
        f"deleted {count} run(s) started more than {format_duration(older.total_seconds())}"
        f" ago from {'.'.join(history)}"
    )
    return EXIT_OK


def _history(conn: Connection, call: Call, history: tuple[str, ...], since: timedelta) -> int:
    import json

    from dislock.cli.admin import format_duration
    from dislock.cli.runs.envelope import marks, successes_before
    from dislock.cli.runs.history_report import attempts, render_runs, render_tails
    from dislock.cli.runs.run_history import runs as runs_of

    key, table = call.args.lock_key, call.table
    if key is not None and unknown_key(conn, table, history, key):
        return EXIT_FAILURE
    runs = send(conn, runs_of(history, table, key, since, call.args.limit))
    envelopes = send(conn, successes_before(history, [(run.key, run.started_at) for run in runs]))
    marked = marks(runs, envelopes)
    if call.args.json:
        numbers = attempts(runs)
        rows = [
            {**run.as_json(), "attempt": numbers.get(run.id), "envelope": marked[run.id]}
            for run in runs
        ]
        print(json.dumps(rows, indent=2))
    elif runs:
        print(render_runs(runs, marked))
        tails = render_tails(runs)
        if tails:
            print(f"\n{tails}")
    else:
        what = f" of {key!r}" if key else ""
        print(f"no runs{what} in the last {format_duration(since.total_seconds())}")
    warn_disagreements(conn, history, since, key)
    return EXIT_OK
