"""The acquiring statements, and the reads before (``look``) and after (``mine``) them,
answer the columns their readers' row types name (``dislock.core.answers``), by those
names and in that order: the server's own description of each answer.  So do the
other statements whose rows have several columns: the renewals, a waiter's
``listen``, core's other reads, and ``dislockctl``'s (``dislock.cli``)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from dislock.core.answers import ClaimRow, ClockClaimRow, LookRow, RetryingClaimRow, SlotClaimRow
from dislock.core.cron import SlotCandidates
from dislock.core.exchange import Exchange, select_list
from dislock.core.lock_statements import statements
from dislock.core.rows import lease_key, schedule_key
from dislock.core.unknown_outcome import Mine
from dislock.core.waiting import ListenRow, listen
from tests.conftest import as_sent


def described(db: psycopg.Connection[Any], exchange: Exchange[Any]) -> list[str]:
    sent = as_sent(exchange)
    cursor = db.execute(sent.query, sent.params)
    assert cursor.description is not None
    return [column.name for column in cursor.description]


@pytest.mark.parametrize("fencing", [False, True])
def test_every_acquiring_statement_answers_its_row_types_columns(
    db: psycopg.Connection[Any], lock_table: tuple[str, str], fencing: bool
) -> None:
    if fencing:
        from psycopg import sql

        db.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN fence bigint NOT NULL DEFAULT 0").format(
                sql.Identifier(*lock_table)
            )
        )
    made = statements(lock_table, fencing=fencing)
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    candidates = SlotCandidates.around("* * * * *", datetime.now(timezone.utc))
    answered: dict[str, tuple[Exchange[Any], tuple[str, ...]]] = {
        "acquire_until": (made.acquire_until(schedule_key("a"), "o", later), ClaimRow._fields),
        "acquire_for": (made.acquire_for(lease_key("b"), "o", 5.0), ClaimRow._fields),
        "take_over": (made.take_over(lease_key("c"), "o", "s", 5.0), ClaimRow._fields),
        "acquire_by_clock": (
            made.acquire_by_clock(schedule_key("d"), "o", candidates),
            ClockClaimRow._fields,
        ),
        "acquire_retrying": (
            made.acquire_retrying(schedule_key("e"), "o", later, lease=None, retries=2, delay=1.0),
            RetryingClaimRow._fields,
        ),
        "acquire_slot": (made.acquire_slot([lease_key("f")], "o", 5.0), SlotClaimRow._fields),
        "look": (made.look(lease_key("b"), ttl=5.0), LookRow._fields),
        "mine": (made.mine([lease_key("b")], "o"), Mine._fields),
    }
    for name, (exchange, fields) in answered.items():
        assert described(db, exchange) == list(fields), name


def test_cores_other_statements_answer_their_row_types_columns(
    db: psycopg.Connection[Any], lock_table: tuple[str, str]
) -> None:
    from dislock.core import (
        answers,
        failover,
        grant_catalog,
        limits,
        replace_marks,
        retries,
        table_locks,
    )

    renewing: dict[str, list[Any]] = {"keys": [], "owners": [], "ttls": []}
    answered: dict[str, tuple[Exchange[Any], tuple[str, ...]]] = {
        "listen": (listen(lock_table, "a"), ListenRow._fields),
        "renew": (
            Exchange(statements(lock_table).queries.renew_batch, renewing, answers.read_renewed),
            answers.Renewed._fields,
        ),
        "max_ttl": (limits.max_ttl(lock_table), limits.MaxTtl._fields),
        "delay_state": (failover.delay_state(lock_table), failover.DelayState._fields),
        "mark": (replace_marks.mark(lock_table, lease_key("a"), "s"), replace_marks.Marked._fields),
        "values": (
            replace_marks.values(lock_table, [lease_key("a")]),
            replace_marks.KeyValue._fields,
        ),
        "qualified": (grant_catalog.qualified(lock_table), grant_catalog.Qualified._fields),
        "audit": (grant_catalog.audit(lock_table), grant_catalog.Loophole._fields),
        "grants_on": (grant_catalog.grants_on(lock_table), grant_catalog.PolicyRow._fields),
        "rerun": (retries.rerun(lock_table, "a"), retries.Rerun._fields),
        "holders": (table_locks.holders([lock_table]), table_locks.Holder._fields),
    }
    for name, (exchange, fields) in answered.items():
        assert described(db, exchange) == list(fields), name


def test_dislockctls_statements_answer_their_row_types_columns(
    db: psycopg.Connection[Any], lock_table: tuple[str, str], history: tuple[str, ...]
) -> None:
    from dislock.cli import admin, diagnosis, lock_rows
    from dislock.cli.runs import missed_slots, run_history
    from dislock.cli.serve import scrape
    from dislock.core import operator_commands

    day = timedelta(days=1)
    since = datetime.now(timezone.utc) - day

    answered: dict[str, tuple[Exchange[Any], tuple[str, ...]]] = {
        "listing": (lock_rows.listing(lock_table), lock_rows.ListedRow._fields),
        "states": (lock_rows.states(lock_table, [lease_key("a")]), lock_rows.RowState._fields),
        "forced_release": (
            lock_rows.forced_release(lock_table, "a", ["lease"]),
            lock_rows.ReleasedRow._fields,
        ),
        "row_security": (diagnosis.row_security(lock_table), diagnosis.SecurityRow._fields),
        "runs": (run_history.runs(history, lock_table, None, day, 5), run_history.Run._fields),
        "runs of a key": (
            run_history.runs(history, lock_table, "a", day, 5),
            run_history.Run._fields,
        ),
        "latest": (run_history.latest(history, lock_table), run_history.Latest._fields),
        "recorded_schedule": (
            run_history.recorded_schedule(history, "a"),
            run_history.Recorded._fields,
        ),
        "readings_of": (
            run_history.readings_of(history, since, None),
            run_history.Reading._fields,
        ),
        "starts": (
            missed_slots.starts(history, lock_table, "a", since),
            missed_slots.StartRow._fields,
        ),
        "spans": (
            missed_slots.spans(history, lock_table, "a", since),
            missed_slots.SpanRow._fields,
        ),
        "pauses": (operator_commands.pauses(history, "a", since), operator_commands.Event._fields),
    }
    scraping = scrape.ScrapeStatements(history, lock_table)
    answered |= {
        "run_details": (scraping.run_details([1], since), scrape.RunDetails._fields),
        "census": (scraping.census(0), scrape.CensusRow._fields),
        "window_starts": (scraping.window_starts(since), scrape.ScrapedRun._fields),
        "window_events": (scraping.window_events(since), scrape.ScrapedRun._fields),
        "new_runs": (scraping.new_runs(0, [1]), scrape.ScrapedRun._fields),
        "spans_before": (scraping.spans_before(since, ["a"]), scrape.ScrapedRun._fields),
    }
    answered["refusing_writes"] = (admin.refusing_writes(), admin.Writability._fields)
    for name, (exchange, fields) in answered.items():
        assert described(db, exchange) == list(fields), name


def test_a_select_list_names_each_field_once_or_refuses() -> None:
    from psycopg import sql

    listed = select_list(("a", "b"), b=sql.SQL("2"), a=sql.SQL("1"))
    assert listed.as_string(None) == '1 AS "a", 2 AS "b"'
    with pytest.raises(ValueError, match="do not match"):
        select_list(("a", "b"), a=sql.SQL("1"))
    with pytest.raises(ValueError, match="do not match"):
        select_list(("a",), a=sql.SQL("1"), c=sql.SQL("3"))
