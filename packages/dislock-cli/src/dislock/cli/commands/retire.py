"""``dislockctl retire``: take LOCK_KEY off ``ls``, ``missed``, ``serve`` and the status
page for good (a key run once by hand, a job gone): its lock rows, its pause and its
run history are deleted, in one transaction with its row of the audit trail; refused
while a run of it holds its lock.  A run of it later starts it afresh."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dislock.cli import EXIT_OK
from dislock.cli.commands._call import Call, add_reason_argument, audit, columns, error

if TYPE_CHECKING:
    from dislock.cli.sending import Connection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lock_key", metavar="LOCK_KEY")
    add_reason_argument(parser)


def run(call: Call) -> int:
    history = call.history_table()
    return call.connected(lambda conn: _retire(conn, call, history), history=history, audited=True)


def _retire(conn: Connection, call: Call, history: tuple[str, ...]) -> int:
    from psycopg import sql

    from dislock.cli.lock_rows import retiring
    from dislock.cli.sending import send
    from dislock.core.bounds import clip

    lock_key = call.args.lock_key
    done = send(conn, retiring(call.table, lock_key))
    if done.live is not None:
        return error(
            f"{lock_key!r} is held ({clip(done.live)} is live): retire it once its run has"
            " ended, or release it first"
        )
    runs = 0
    if columns(conn, history):
        deleted = conn.execute(
            sql.SQL("DELETE FROM {} WHERE lock_key = %s").format(sql.Identifier(*history)),
            (lock_key,),
        )
        runs = deleted.rowcount
    if not done.deleted and not runs:
        return error(f"nothing to retire: {lock_key!r} has no lock row and no recorded run")
    audit(conn, call, "retire", lock_key, f"{done.deleted} lock row(s), {runs} run(s)")
    print(
        f"retired {lock_key!r}: deleted {done.deleted} lock row(s) and {runs} recorded run(s);"
        " it is off ls, missed and serve until it runs again"
    )
    return EXIT_OK
