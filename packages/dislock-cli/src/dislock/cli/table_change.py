"""Running a transaction that changes a lock table in use (``grant``, ``revoke``,
``init``) in short tries, so that no machine's acquisition queues behind it for
more than a moment (why: ``dislock.core.table_locks``)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg.errors

from dislock.cli.sending import send
from dislock.core import table_locks

if TYPE_CHECKING:
    from dislock.cli.sending import Connection

Result = TypeVar("Result")


class TableBusy(Exception):
    """Out of patience: the one line that says who holds the table."""


def add_wait_argument(parser: argparse.ArgumentParser) -> None:
    """``--wait``: how long the command keeps trying for the table's lock."""
    parser.add_argument(
        "--wait",
        metavar="DURATION",
        help="how long to keep trying while other sessions hold the table, each try"
        f" holding others up for at most {table_locks.LOCK_WAIT_MS} ms"
        f" (default: {table_locks.DEFAULT_PATIENCE:g}s)",
    )


def patience_of(args: argparse.Namespace) -> float:
    """The ``--wait`` given, in seconds (raises ConfigurationError)."""
    if args.wait is None:
        return table_locks.DEFAULT_PATIENCE
    from dislock.cli.time_args import parse_seconds

    return parse_seconds(args.wait, name="--wait")


def change(
    conn: Connection,
    what: str,
    tables: Sequence[tuple[str, ...]],
    body: Callable[[Any], Result],
    *,
    patience: float,
) -> Result:
    """``body(conn)``'s result, in a transaction whose table locks wait at most
    ``table_locks.LOCK_WAIT_MS`` each, tried again while ``patience`` lasts; else
    ``TableBusy`` naming who holds ``tables[0]``."""
    tries = table_locks.Tries(patience, time.monotonic())
    while True:
        try:
            with conn.transaction():
                conn.execute(table_locks.SET_LOCK_TIMEOUT)
                return body(conn)
        except psycopg.errors.LockNotAvailable:
            delay = tries.next_delay(time.monotonic())
            if delay is None:
                found = send(conn, table_locks.holders(tables))
                raise TableBusy(table_locks.busy(what, tables[0], found, patience)) from None
        time.sleep(delay)
