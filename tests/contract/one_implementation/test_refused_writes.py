"""The acquiring statements themselves, sent by hand: a refused one writes nothing (no
row lock, no transaction id, no WAL)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg import sql

from dislock.core.rows import lease_key, schedule_key
from tests.conftest import as_sent


def test_a_refused_acquisition_writes_nothing(
    db: psycopg.Connection[Any], lock_table: tuple[str, str]
) -> None:
    """A live row refuses an acquisition before the upsert tries it: no row lock, so no
    transaction id, no WAL and no durable commit for each of a herd's losers.  Each
    statement runs in a transaction of its own, which then says whether it wrote."""
    from datetime import datetime, timezone

    from dislock.core.cron import UTC, SlotCandidates
    from dislock.core.exchange import Exchange
    from dislock.core.lock_statements import statements as lock_statements
    from dislock.core.waiting import slot_keys

    statements = lock_statements(lock_table)
    lease, slot, by_clock = lease_key("herd"), schedule_key("herd"), schedule_key("herd-clock")
    slot_end = db.execute("SELECT date_trunc('hour', NOW()) + interval '1 hour'").fetchone()
    assert slot_end is not None
    candidates = SlotCandidates.around("0 * * * *", datetime.now(timezone.utc), UTC)
    slots = slot_keys("herd-slots", 2)
    exchanges: list[Exchange[Any]] = [
        statements.acquire_for(lease, "{owner}", 60.0),
        statements.acquire_until(slot, "{owner}", slot_end[0]),
        statements.acquire_by_clock(by_clock, "{owner}", candidates),
        statements.acquire_slot(slots, "{owner}", 60.0),
        statements.acquire_slot(slots, "{owner}", 60.0),
    ]
    attempts = [(as_sent(exchange).query, as_sent(exchange).params) for exchange in exchanges]

    def attempt(
        statement: sql.SQL | sql.Composed, params: dict[str, Any], owner: str
    ) -> tuple[Any, Any]:
        mine = {name: owner if value == "{owner}" else value for name, value in params.items()}
        with db.transaction():
            answer = db.execute(statement, mine).fetchone()
            xid = db.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()
        assert answer is not None and xid is not None
        return answer[0], xid[0]

    for statement, params in attempts:
        taken, xid = attempt(statement, params, f"winner-{uuid.uuid4().hex[:6]}")
        assert taken and xid is not None  # the winner wrote its row
    for statement, params in attempts:
        taken, xid = attempt(statement, params, "loser")
        assert not taken and xid is None, statement.as_string(None)[:80]
