"""The acquiring statements find their rows through the primary key on a big table.

A statement that scans the table costs every acquisition time in proportion to
the number of keys; it does not show on the small tables of the other tests, so
these fill the table and read the server's own plan (EXPLAIN ANALYZE)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock.core.lock_statements import statements
from tests.conftest import as_sent


def executed_seq_scans(plan: dict[str, Any]) -> list[str]:
    """The relations a plan's node (and those under it) scanned sequentially, when
    the node ran at all."""
    found = []
    if plan.get("Node Type") == "Seq Scan" and plan.get("Actual Loops", 0) > 0:
        found.append(f"{plan['Relation Name']}: {plan.get('Filter', '')}")
    for child in plan.get("Plans", []):
        found += executed_seq_scans(child)
    return found


@pytest.fixture
def big_table(db: psycopg.Connection[Any], lock_table: tuple[str, str]) -> tuple[str, str]:
    db.execute(
        sql.SQL(
            "INSERT INTO {} SELECT 'cronjob-lock:lease:filler-' || g, 'x', NOW()"
            " FROM generate_series(1, 20000) g"
        ).format(sql.Identifier(*lock_table))
    )
    db.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(*lock_table)))
    return lock_table


@pytest.mark.parametrize("kind", ["lease", "schedule"])
def test_an_acquisition_reads_no_row_by_scanning(
    db: psycopg.Connection[Any], big_table: tuple[str, str], kind: str
) -> None:
    chosen = statements(big_table)
    if kind == "lease":
        exchange = chosen.acquire_for("cronjob-lock:lease:job", "me", 30.0)
    else:
        end = datetime.now(UTC) + timedelta(minutes=1)
        exchange = chosen.acquire_until("cronjob-lock:schedule:job", "me", end)
    sent = as_sent(exchange)
    params = sent.params
    explain = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) {}").format(sent.query)
    # Twice: the first acquisition also records the timeline and the TTL.
    for _ in range(2):
        row = db.execute(explain, params).fetchone()
        assert row is not None
        plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
        db.execute(
            sql.SQL("UPDATE {} SET expire_at = NOW() WHERE key = %s").format(
                sql.Identifier(*big_table)
            ),
            (params["key"],),
        )
    assert executed_seq_scans(plan[0]["Plan"]) == []
