"""The attacks of the security review (#61) that a hostile team B ran against team A
on one shared lock table, each against the lock functions a team calls by hand: B
ends none of A's runs (N2), grows no lock row's value past its bound (N9), holds no
more keys than its quota from REPEATABLE READ transactions (N10), and its history
stays within its budget, without a rescan of the history at each run (N11)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock.core.bounds import MAX_STORED_BYTES
from dislock.core.history_functions import BUDGET_PREFIX, ROW_BYTES, USED_PREFIX
from dislock.core.protocol import call
from tests.security.conftest import BILLING, REPORTS_ROLE, Fleet, ctl, with_history
from tests.security.test_lock_functions import acquire

REPORTS = (REPORTS_ROLE, "--keys", "reports-*")

START = ("lock_key", "modes", "slot_end", "owner", "host", "pid", "cron", "cron_tz")
END = ("id", "outcome", "exit_code", "signal", "ended_at", "stdout_tail", "stderr_tail")


def start(conn: psycopg.Connection[Any], history: tuple[str, ...], key: str, **args: Any) -> int:
    params = {"modes": "lease", "slot_end": None, "owner": "o", "host": "h", "pid": 1}
    params |= {"cron": None, "cron_tz": None, "lock_key": key, **args}
    row = conn.execute(call(history, "start", START), params).fetchone()
    assert row is not None
    return int(row[0])


def end(conn: psycopg.Connection[Any], history: tuple[str, ...], run: int, **args: Any) -> bool:
    params = {"id": run, "outcome": "ok", "exit_code": 0, "signal": None, "ended_at": None}
    params |= {"stdout_tail": None, "stderr_tail": None, **args}
    return conn.execute(call(history, "end", END), params).fetchone() is not None


def run_row(db: psycopg.Connection[Any], history: tuple[str, ...], run: int) -> Any:
    return db.execute(
        sql.SQL("SELECT ended_at, outcome, stdout_tail FROM {} WHERE id = %s").format(
            sql.Identifier(*history)
        ),
        (run,),
    ).fetchone()


def test_a_team_ends_none_of_another_teams_runs(fleet: Fleet, db: psycopg.Connection[Any]) -> None:
    """N2: B ends A's run by its id, and A's next run's id while B holds its own usage
    row in an open transaction (so that, in the old function, the run's key was read
    before A's row existed and written after)."""
    history = with_history(fleet, db, BILLING, REPORTS)
    with fleet.connect(fleet.billing) as a, fleet.connect(fleet.reports) as b:
        running = start(a, history, "billing-a")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            end(b, history, running, stdout_tail="B was here")
        assert run_row(db, history, running) == (None, None, None)
        with fleet.connect(fleet.reports) as holding:
            holding.execute("BEGIN")
            mine = start(holding, history, "reports-b")
            ended: list[bool] = []
            ender = threading.Thread(
                target=lambda: ended.append(end(b, history, mine + 1, stdout_tail="B was here")),
            )
            ender.start()
            pid = b.info.backend_pid
            waiting = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s"
            while ender.is_alive() and not (db.execute(waiting, (pid,)).fetchone() or (0,))[0]:
                ender.join(0.05)
            nxt = start(a, history, "billing-a")
            assert nxt == mine + 1
            holding.execute("COMMIT")
            ender.join()
        assert ended == [False]
        assert run_row(db, history, nxt) == (None, None, None)
        assert end(a, history, nxt, outcome="failed", exit_code=1)
        assert run_row(db, history, nxt)[1:] == ("failed", None)


def test_no_call_appends_a_lock_rows_value_past_its_bound(fleet: Fleet) -> None:
    """N9: a replacer's mark, appended again and again with marks that never match."""
    key, pause = "cronjob-lock:lease:billing-m", "cronjob-lock:pause:billing-m"
    params = {"key": key, "mark": "x" * 4000, "marked": "never-1", "handed": "never-2"}
    marking = call(fleet.table, "mark", tuple(params))
    with fleet.connect(fleet.billing) as b:
        assert acquire(b, fleet, key, pause)[0] is True
        assert b.execute(marking, params).fetchone() is not None
        for _ in range(3):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="longer than"):
                b.execute(marking, params)
    with fleet.connect(fleet.admin_url) as admin:
        (size,) = admin.execute(
            sql.SQL("SELECT octet_length(value) FROM {} WHERE key = %s").format(
                sql.Identifier(*fleet.table)
            ),
            (key,),
        ).fetchone() or (None,)
    assert size is not None and size <= MAX_STORED_BYTES


def test_the_key_quota_holds_in_repeatable_read_transactions(fleet: Fleet) -> None:
    """N10: four REPEATABLE READ transactions, their snapshots taken before any other
    commits, each taking five new keys against a quota of ten (one key held already)."""
    quota = 10
    grant = ("grant", *REPORTS, "--max-keys", str(quota))
    assert ctl(fleet.admin_url, *grant, table=fleet.table)[0] == 0
    with fleet.connect(fleet.reports) as first:  # (its TTL record: no row they all update)
        acquire(first, fleet, "cronjob-lock:lease:reports-rr", "cronjob-lock:pause:reports-rr")
    ready = threading.Barrier(4)
    refused: list[BaseException] = []

    def team(n: int) -> None:
        with fleet.connect(fleet.reports) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            conn.execute("SELECT 1")  # (the snapshot, before any other transaction commits)
            ready.wait()
            try:
                for i in range(5):
                    key = f"reports-rr{n}-{i}"
                    acquire(conn, fleet, f"cronjob-lock:lease:{key}", f"cronjob-lock:pause:{key}")
                conn.execute("COMMIT")
            except psycopg.Error as exc:
                refused.append(exc)

    threads = [threading.Thread(target=team, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with fleet.connect(fleet.admin_url) as admin:
        (held,) = admin.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE key LIKE %s").format(
                sql.Identifier(*fleet.table)
            ),
            ("cronjob-lock:lease:reports-rr%",),
        ).fetchone() or (None,)
    assert held is not None and held <= quota
    assert len(refused) == 4 and all("READ COMMITTED" in str(exc) for exc in refused), refused


def _seq_scans(conn: psycopg.Connection[Any], history: tuple[str, ...]) -> int:
    """The scans of the whole ``history`` in the transaction of ``conn`` (its own
    counts, so that no other session's late report can change them)."""
    (scans,) = conn.execute(
        "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = %s::regclass",
        (sql.Identifier(*history).as_string(None),),
    ).fetchone() or (0,)
    return int(scans)


def test_the_history_budget_holds_without_a_rescan(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    """N11: a budget of 20,000 bytes, 40 runs of 4 kB owners and tails: every run is
    recorded, the role's rows stay within the budget and a row (its key's oldest runs
    make room, never its newest success), and past the budget no start or end reads
    the whole history (3,000 rows of other keys, analysed)."""
    history = with_history(fleet, db, BILLING, REPORTS)
    table, runs = sql.Identifier(*fleet.table), sql.Identifier(*history)
    budget = 20_000
    db.execute(
        sql.SQL(
            "INSERT INTO {} (key, value, expire_at) VALUES (%s, %s, 'infinity')"
            " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
        ).format(table),
        (BUDGET_PREFIX + REPORTS_ROLE, str(budget)),
    )
    db.execute(
        sql.SQL(
            "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at)"
            " SELECT 'billing-' || i, 'lease', 'o', 'h', 1, now() FROM generate_series(1, 3000) i"
        ).format(runs)
    )
    db.execute(sql.SQL("ANALYZE {}").format(runs))
    big, tail = "o" * 4000, "t" * 4000
    with fleet.connect(fleet.reports) as b:
        succeeded = start(b, history, "reports-big", owner=big)
        assert end(b, history, succeeded, stdout_tail="done")
        for n in range(40):
            if n == 10:  # (past the budget: the next 30 in one transaction, counted)
                b.execute("BEGIN")
                before = _seq_scans(b, history)
            run = start(b, history, "reports-big", owner=big)
            assert end(b, history, run, outcome="failed", exit_code=1, stdout_tail=tail)
        assert _seq_scans(b, history) == before
        b.execute("COMMIT")
        assert run_row(db, history, run)[1] == "failed"
    mine = sql.SQL("SELECT sum({}), max({}) FROM {} AS h WHERE lock_key = 'reports-big'").format(
        sql.SQL(ROW_BYTES.format(h="h")), sql.SQL(ROW_BYTES.format(h="h")), runs
    )
    count = sql.SQL("SELECT value::int8 FROM {} WHERE key = %s").format(table)
    used: Any = (USED_PREFIX + REPORTS_ROLE,)
    stored, largest = db.execute(mine).fetchone() or (0, 0)
    assert db.execute(count, used).fetchone() == (stored,)
    assert stored <= budget + largest
    assert run_row(db, history, succeeded)[1] == "ok"
    # A prune by hand takes the room it made off the count (of its older half).
    db.execute(
        sql.SQL("UPDATE {} SET started_at = started_at - interval '1 day' WHERE id < %s").format(
            runs
        ),
        (run - 10,),
    )
    assert ctl(fleet.admin_url, "history", "--prune-older-than", "1s", table=fleet.table)[0] == 0
    left, _ = db.execute(mine).fetchone() or (0, 0)
    assert db.execute(count, used).fetchone() == (left,)
    assert 0 < left < stored
