"""Every operator view stays small and inert whatever is in the tables (issue #35,
item 6): rows written by the table's owner, or by a role before its grant, may hold
megabytes and terminal sequences that no bound stopped.  One 50 MB ``value`` had
made ``dislockctl ls`` print 1.1 GB; a 5 MB history ``host`` 37 MB of ``history``;
the status page grew to 52 MB; outcomes became Prometheus label values, ESC included.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from dislock.cli.run_metrics import RUN_OUTCOMES
from tests.cli.conftest import Ctl
from tests.cli.serving import serving

BIG = 5_000_000
"""Characters of a huge text (it compresses: the server stores it small)."""

HUGE_KEY = "k" * 100_000 + "\x1b[2J"
"""A lock key as long as the primary key's index takes (compressed), with a sequence
that clears the screen."""

SMALL = 20_000
"""Bytes a view of a few rows may print."""


def _write_rows(db: psycopg.Connection[Any], table: tuple[str, ...], key: str) -> None:
    """As the table's owner: a live lease under a huge key held by a huge owner, a
    huge released owner of ``key``'s slot, a pause of ``key`` with a huge reason,
    and one ordinary lease beside them."""
    db.execute(
        sql.SQL(
            "INSERT INTO {} VALUES"
            " ('cronjob-lock:lease:' || %(huge_key)s, %(owner)s, NOW() + interval '1 hour'),"
            " ('cronjob-lock:schedule:' || %(key)s, %(owner)s || ' (released)',"
            " NOW() - interval '1 minute'),"
            " ('cronjob-lock:pause:' || %(key)s, %(reason)s, NOW() + interval '1 hour'),"
            " ('cronjob-lock:lease:' || %(key)s || '-plain', 'host:1:abcd',"
            " NOW() + interval '1 hour')"
        ).format(sql.Identifier(*table)),
        {
            "huge_key": HUGE_KEY,
            "key": key,
            "owner": "\x1b]0;owned\x07" + "o" * BIG,
            "reason": "r" * BIG + "\x1b[31m",
        },
    )


def _write_runs(db: psycopg.Connection[Any], table: tuple[str, ...], key: str) -> None:
    """As the history's owner: a finished run of ``key`` with a huge host, owner and
    outcome, and one that read its schedule as a huge cron expression (so that the
    two disagree, and ``history`` warns of it)."""
    schema, name = table
    db.execute(
        sql.SQL(
            "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at, ended_at,"
            " outcome, cron, cron_tz) VALUES"
            " (%(key)s, 'schedule', %(owner)s, %(host)s, 1, NOW() - interval '2 minutes',"
            " NOW() - interval '1 minute', %(outcome)s, '0 * * * *', 'UTC'),"
            " (%(key)s, 'schedule', 'o', 'h', 2, NOW() - interval '3 minutes',"
            " NOW() - interval '2 minutes', 'ok', %(cron)s, %(zone)s)"
        ).format(sql.Identifier(schema, f"{name}_history")),
        {
            "key": key,
            "owner": "o" * BIG,
            "host": "h" * BIG + "\x1b[31m",
            "outcome": "\x1b]0;owned\x07" + "x" * BIG,
            "cron": "0 " * (BIG // 2),
            "zone": "z" * BIG + "\x1b[2J",
        },
    )


def _table(env: dict[str, str]) -> tuple[str, str]:
    schema, name = env["LOCK_TABLE"].split(".")
    return schema, name


def test_ls_shows_a_few_characters_of_each_huge_cell(
    ctl: Ctl, cli_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    key = cli_env["LOCK_KEY"]
    _write_rows(db, _table(cli_env), key)
    listed = ctl("ls")
    assert listed.returncode == 0, listed.stderr
    out = listed.stdout
    assert len(out.encode()) < SMALL, len(out)
    assert "\x1b" not in out and "\\x1b" in out
    # No line is padded to the widest cell: the ordinary lease's line stays short.
    (plain,) = [line for line in out.splitlines() if f"{key}-plain" in line]
    assert len(plain) < 200 and "host:1:abcd" in plain, plain
    assert "…" in out

    as_json = ctl("ls", "--json")
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    assert len(as_json.stdout.encode()) < 3 * SMALL, len(as_json.stdout)
    (plain_row,) = [row for row in rows if row["lock_key"] == f"{key}-plain"]
    assert plain_row["owner"] == "host:1:abcd" and not plain_row["truncated"]
    for row in rows:
        assert len(json.dumps(row)) < SMALL
        assert row["truncated"] == (row is not plain_row), row["key"][:40]


def test_history_shows_a_few_characters_of_each_huge_cell(
    ctl: Ctl, history_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    key = history_env["LOCK_KEY"]
    _write_runs(db, _table(history_env), key)
    shown = ctl("history", env=history_env)
    assert shown.returncode == 0, shown.stderr
    for text in (shown.stdout, shown.stderr):
        assert len(text.encode()) < SMALL, len(text)
        assert "\x1b" not in text and "\x07" not in text
    assert "…" in shown.stdout
    assert "read its schedule differently" in shown.stderr, shown.stderr

    as_json = ctl("history", "--json", env=history_env)
    assert as_json.returncode == 0, as_json.stderr
    assert len(as_json.stdout.encode()) < 2 * SMALL, len(as_json.stdout)
    runs = json.loads(as_json.stdout)
    assert [run["truncated"] for run in runs] == [True, True]
    assert len(as_json.stderr.encode()) < SMALL


def test_the_page_and_the_metrics_stay_small_and_inert(
    history_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    key = history_env["LOCK_KEY"]
    table = _table(history_env)
    _write_rows(db, table, key)
    _write_runs(db, table, key)
    with serving(history_env) as served:
        status, _, page = served.get("/")
        assert status == 200
        assert len(page.encode()) < SMALL, len(page)
        assert "\x1b" not in page and "\x07" not in page
        assert "…" in page

        status, _, body = served.get("/metrics")
        assert status == 200
        assert len(body.encode()) < SMALL, len(body)
        assert "\x1b" not in body and "\x07" not in body
        outcomes = {
            sample.labels["outcome"]
            for family in text_string_to_metric_families(body)
            for sample in family.samples
            if "outcome" in sample.labels
        }
        assert outcomes == {*RUN_OUTCOMES, "other"}
        keys = {
            sample.labels["key"]
            for family in text_string_to_metric_families(body)
            for sample in family.samples
            if "key" in sample.labels
        }
        assert key in keys and f"{key}-plain" in keys
        assert all(len(label) < 100 for label in keys), sorted(map(len, keys))


# Slow (40,000 rows written, a first scrape that reads them all): on one leg only, the
# embedded server of its own; on CI's shared PostgreSQL 15, under two CPU burners, that
# first scrape took over 30 s (left for the next issue: see the session's note).
@pytest.mark.slow
def test_many_unended_runs_of_one_team_keep_the_page_and_the_metrics_up(
    history_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    """Security review #48: 20,000 runs that never ended, of one team, in the history
    (a role may insert them): the scrape's reads of them hit the statement timeout,
    and made ``dislock_up 0``.  What the scrape and the page read is bounded."""
    key = history_env["LOCK_KEY"]
    schema, name = _table(history_env)
    db.execute(
        sql.SQL(
            "INSERT INTO {} (lock_key, modes, slot_end, owner, host, pid, started_at, cron,"
            " cron_tz) SELECT %(key)s || '-' || n, 'schedule', NOW() - n * interval '1 s',"
            " 'o', 'h', n, NOW() - n * interval '2 s', '* * * * *', 'UTC'"
            " FROM generate_series(1, 20000) AS n"
        ).format(sql.Identifier(schema, f"{name}_history")),
        {"key": key},
    )
    # Each key with its slot's row, as its runs wrote them.
    db.execute(
        sql.SQL(
            "INSERT INTO {} SELECT 'cronjob-lock:schedule:' || %(key)s || '-' || n, 'o',"
            " NOW() + interval '1 hour' FROM generate_series(1, 20000) AS n"
        ).format(sql.Identifier(schema, name)),
        {"key": key},
    )
    with serving(history_env) as served:
        # What is bounded is what the scrape reads, not how long 20,000 keys take: a
        # snapshot of them takes about 5 s with CI's load beside it (serve.slot_counts;
        # 35 s before it), and the harness waits well past that on a slower machine.
        served.timeout = 180.0
        for _ in range(3):  # the first scrape reads the history whole; later ones follow it
            metrics = served.metrics()
            assert metrics[("dislock_up", ())] == 1.0
            status, _, page = served.get("/")
            assert status == 200 and "did not answer" not in page
            assert len(page.encode()) < 30 * SMALL, len(page)
            assert "19500 more keys not shown" in page
    assert "did not answer" not in "".join(served.log), served.log
