"""The run history's statements themselves, sent by hand: they commit asynchronously and
leave the session as it was."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.support.rows import history_runs


def test_history_writes_commit_asynchronously_and_leave_the_session_as_it_was(
    db: psycopg.Connection[Any], history: tuple[str, ...]
) -> None:
    """The history statements turn off synchronous_commit for their own transaction
    only: the connection they share with lock statements stays durable."""
    from dislock.cli.sending import send
    from dislock.core import history as statements

    start = statements.start(
        history, lock_key="k", modes=["lease"], slot_end=None, owner="o", host="h", pid=1, cron=None
    )
    run_id = send(db, start).run_id
    assert db.execute("SHOW synchronous_commit").fetchone() == ("on",)
    send(db, statements.end(history, run_id, statements.RunEnd("ok", 0)))
    assert db.execute("SHOW synchronous_commit").fetchone() == ("on",)
    (run,) = history_runs(db, history, "k")
    assert (run["outcome"], run["exit_code"], run["ordered"]) == ("ok", 0, True)
