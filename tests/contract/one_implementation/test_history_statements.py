"""The run history's statements themselves, sent by hand: they commit asynchronously and
leave the session as it was."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.conftest import BARE_TABLES
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


def test_the_last_success_is_read_from_the_index_of_a_keys_runs(
    db: psycopg.Connection[Any], history: tuple[str, ...]
) -> None:
    """The lookup every run's start makes (its plain statement and its function share
    it): the newest ``ok`` row of one key, by the index of a key's runs newest first,
    never a scan of the table nor a sort, among 20,000 runs of 200 keys."""
    from psycopg import sql

    from dislock.core.history import last_success_query

    db.execute(
        sql.SQL(
            "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at, outcome)"
            " SELECT 'key-' || n % 200, 'lease', 'o', 'h', 1, now() - n * interval '1 min',"
            " CASE WHEN n % 3 = 0 THEN 'ok' ELSE 'failed' END FROM generate_series(1, 20000) AS n"
        ).format(sql.Identifier(*history))
    )
    db.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(*history)))
    lookup = last_success_query(history, sql.Literal("key-7"))
    explained = db.execute(sql.SQL("EXPLAIN (FORMAT JSON) {}").format(lookup)).fetchone()
    assert explained is not None
    nodes = []
    stack = [explained[0][0]["Plan"]]
    while stack:
        node = stack.pop()
        nodes.append((node["Node Type"], node.get("Index Name")))
        stack += node.get("Plans", [])
    assert ("Index Scan", f"{history[-1]}_key_started") in nodes, nodes
    assert not {"Seq Scan", "Sort", "Bitmap Heap Scan"} & {kind for kind, _ in nodes}, nodes
    newest = sql.SQL("SELECT max(started_at) FROM {} WHERE lock_key = 'key-7' AND outcome = 'ok'")
    found, expected = (
        db.execute(q).fetchone() for q in (lookup, newest.format(sql.Identifier(*history)))
    )
    assert found is not None and expected is not None and found[0] == expected[0]


OLD_START = """DROP FUNCTION {start}(text, text, timestamptz, text, text, int4, text, text);
CREATE FUNCTION {start}(p_lock_key text, p_modes text,
    p_slot_end timestamptz, p_owner text, p_host text, p_pid int4, p_cron text, p_cron_tz text)
RETURNS TABLE (id int8) LANGUAGE sql AS $$
    INSERT INTO {history} (lock_key, modes, slot_end, owner, host, pid, started_at, cron, cron_tz)
    VALUES (p_lock_key, p_modes, p_slot_end, p_owner, p_host, p_pid, now(), p_cron, p_cron_tz)
    RETURNING id $$;
COMMENT ON FUNCTION {start}(text, text, timestamptz, text, text, int4, text, text)
IS 'dislock history functions 1'"""


@pytest.mark.skipif(
    BARE_TABLES, reason="a table without the functions has no older ones to replace"
)
def test_a_start_function_of_version_1_is_read_and_replaced(
    db: psycopg.Connection[Any], lock_table: tuple[str, str], history: tuple[str, ...]
) -> None:
    """A table whose history functions are older (their start answered the id alone):
    this client records its runs through them all the same, without a last success,
    and ``init`` (or ``grant``) replaces them, though the answer's columns changed."""
    from psycopg import sql

    from dislock.cli.sending import send
    from dislock.core import history as statements
    from dislock.core import history_functions
    from dislock.core.protocol import function

    db.execute(
        sql.SQL(OLD_START).format(
            start=function(history, "start"), history=sql.Identifier(*history)
        )
    )
    assert not send(db, history_functions.installed(history))

    def started() -> statements.RunStart:
        start = statements.start(
            history, lock_key="k", modes=["lease"], slot_end=None, owner="o", host="h", pid=1,
            cron=None,
        )  # fmt: skip
        run = send(db, start)
        send(db, statements.end(history, run.run_id, statements.RunEnd("ok", 0)))
        return run

    assert started().last is None  # the old function's answer: the id alone
    db.execute(history_functions.history_functions_sql((history[0], history[1]), lock_table))
    assert send(db, history_functions.installed(history))
    (first, _) = [run["started_at"] for run in history_runs(db, history, "k")] + [None]
    last = started().last
    assert last is not None and last[0] == first
