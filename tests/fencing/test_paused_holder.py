"""A paused holder's late write is refused by the fencing recipe of docs/fencing.md."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from dislock import LeaseLock, LockContext
from dislock.cli.admin import init_statements
from dislock.core.rows import lease_key
from tests.support.eventually import eventually, wait_for

ROOT = Path(__file__).resolve().parents[2]
TTL = 1.0


def recipe() -> str:
    """The guarded write exactly as the documentation gives it."""
    text = (ROOT / "docs" / "fencing.md").read_text()
    match = re.search(r"-- recipe: guarded-write\n(.*?;)\n", text, re.DOTALL)
    assert match, "docs/fencing.md lost its guarded-write recipe"
    return match.group(1)


HOLDER = """
import sys, time
from pathlib import Path
import psycopg
from dislock import LeaseLock, LockContext, LeaseLostError

url, schema, lock_key, workdir, write = sys.argv[1:6]
work = Path(workdir)
context = LockContext(url=url, table_parts=[schema, "key_value"], lock_key=lock_key,
                      owner="paused-holder", run_ttl_seconds={ttl}, lease_interval_seconds=0.2,
                      fencing=True)
try:
    with LeaseLock(context) as lock:
        (work / "token").write_text(str(lock.fence))
        (work / "started").touch()
        while not (work / "go").exists():
            time.sleep(0.01)
        with psycopg.connect(url, autocommit=True) as conn:
            cursor = conn.execute(write, {{"resource": "report", "token": lock.fence,
                                          "body": "from the paused holder"}})
        (work / "result").write_text("accepted" if cursor.rowcount == 1 else "rejected")
except LeaseLostError:
    sys.exit(75)
"""


def test_paused_holder_write_is_rejected_and_the_new_holder_write_kept(
    database_url: str,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    tmp_path: Path,
) -> None:
    schema = lock_table[0]
    for statement in init_statements(lock_table, fencing=True):
        db.execute(statement)
    db.execute(
        sql.SQL(
            "CREATE TABLE {}.report_output (resource text PRIMARY KEY, fence bigint NOT NULL,"
            " body text NOT NULL)"
        ).format(sql.Identifier(schema))
    )
    write = recipe().replace("report_output", f'"{schema}".report_output')
    lock_key = "report"

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(HOLDER.format(ttl=TTL)),
            database_url,
            schema,
            lock_key,
            str(tmp_path),
            write,
        ]
    )
    wait_for(tmp_path / "started")
    assert (tmp_path / "token").read_text() == "1"

    os.kill(holder.pid, signal.SIGSTOP)  # frozen: no renewals, no writes
    try:
        # Its lease runs out on the server: a TTL after its last renewal, which may
        # have reached the server a little after the stop on a loaded machine.
        time.sleep(TTL)
        expired = sql.SQL("SELECT expire_at <= NOW() FROM {} WHERE key = %s").format(
            sql.Identifier(*lock_table)
        )
        eventually(
            lambda: db.execute(expired, (lease_key(lock_key),)).fetchone() == (True,),
            interval=0.05,
            message="the frozen holder's lease did not run out",
        )
        context = LockContext(
            url=database_url,
            table_parts=list(lock_table),
            lock_key=lock_key,
            owner="new-holder",
            run_ttl_seconds=30.0,
            lease_interval_seconds=5.0,
            fencing=True,
        )
        with LeaseLock(context) as lock:
            assert lock.fence == 2
            cursor = db.execute(
                write, {"resource": "report", "token": lock.fence, "body": "from the new holder"}
            )
            assert cursor.rowcount == 1

            (tmp_path / "go").touch()
            os.kill(holder.pid, signal.SIGCONT)  # wakes up believing it still holds the lock
            holder.wait(timeout=30)
            assert (tmp_path / "result").read_text() == "rejected"
            assert holder.returncode == 75  # and it was told, on leaving the block
    finally:
        if holder.poll() is None:  # the test failed midway: never leave it stopped
            os.kill(holder.pid, signal.SIGCONT)
            holder.kill()
            holder.wait()

    body = db.execute(
        sql.SQL("SELECT fence, body FROM {}.report_output").format(sql.Identifier(schema))
    ).fetchall()
    assert body == [(2, "from the new holder")]
