"""The replace statements (``dislock.core.replace_marks``), sent by hand to a real server: the
mark, the hand-over, the take-over and the withdrawal, each against the rows it must
and must not touch; owners with non-ASCII characters and parentheses."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock.core.answers import Acquired
from dislock.core.exchange import Exchange
from dislock.core.lock_statements import statements
from dislock.core.replace_marks import Marked, hand_over, mark, withdraw
from dislock.core.rows import RELEASED_MARK, lease_key
from tests.conftest import as_sent

KEY = lease_key("nightly")
HOLDER = "wëb-3 (blue):4242:9f3a0c1e"
REPLACER = "wëb-4:77:0badc0de"
THIRD = "web-5:1:aa"


def send(db: psycopg.Connection[Any], exchange: Exchange[Any]) -> Any:
    sent = as_sent(exchange)
    cursor = db.execute(sent.query, sent.params)
    return sent.read(cursor.fetchall() if cursor.description else [])


def value(db: psycopg.Connection[Any], table: tuple[str, str]) -> tuple[str, bool]:
    found = db.execute(
        sql.SQL("SELECT value, expire_at > NOW() FROM {} WHERE key = %s").format(
            sql.Identifier(*table)
        ),
        (KEY,),
    ).fetchone()
    assert found is not None
    return found[0], found[1]


@pytest.fixture
def held(db: psycopg.Connection[Any], lock_table: tuple[str, str]) -> tuple[str, str]:
    """The lease row held by ``HOLDER`` for 30 s more."""
    db.execute(
        sql.SQL(
            "INSERT INTO {} (key, value, expire_at) VALUES (%s, %s, NOW() + interval '30 s')"
        ).format(sql.Identifier(*lock_table)),
        (KEY, HOLDER),
    )
    return lock_table


def test_a_mark_then_a_hand_over_then_a_take_over(
    db: psycopg.Connection[Any], held: tuple[str, str]
) -> None:
    marked = send(db, mark(held, KEY, REPLACER))
    assert isinstance(marked, Marked) and marked.holder == HOLDER
    assert 28 < marked.remaining <= 30
    assert value(db, held) == (f"{HOLDER} (replaced by {REPLACER})", True)
    # The holder's renewal (guarded by its value) now renews nothing.
    renewed = db.execute(
        sql.SQL("UPDATE {} SET expire_at = NOW() WHERE key = %s AND value = %s").format(
            sql.Identifier(*held)
        ),
        (KEY, HOLDER),
    )
    assert renewed.rowcount == 0
    # A second replacer is refused while the first waits...
    assert send(db, mark(held, KEY, THIRD)) is None
    # ...and the take-over finds nothing before the hand-over.
    take = statements(held).take_over(KEY, REPLACER, REPLACER, 30.0)
    refused = send(db, take)
    assert isinstance(refused, Acquired) and not refused.acquired
    # Another owner cannot hand it over; the holder can, once.
    assert send(db, hand_over(held, KEY, THIRD)) is None
    assert send(db, hand_over(held, KEY, HOLDER)) == REPLACER
    assert value(db, held) == (f"{REPLACER} (handed over)", True)
    assert send(db, hand_over(held, KEY, HOLDER)) is None
    # Nor can a second replacer mark the row between the hand-over and the take-over.
    assert send(db, mark(held, KEY, THIRD)) is None
    taken = send(db, take)
    assert taken.acquired
    assert value(db, held) == (REPLACER, True)


def test_a_replacer_that_gives_up_takes_its_mark_back_or_frees_the_row(
    db: psycopg.Connection[Any], held: tuple[str, str]
) -> None:
    send(db, mark(held, KEY, REPLACER))
    # Another replacer's withdrawal touches nothing.
    assert send(db, withdraw(held, KEY, THIRD, RELEASED_MARK)) is False
    assert send(db, withdraw(held, KEY, REPLACER, RELEASED_MARK)) is True
    assert value(db, held) == (HOLDER, True)  # the holder's renewals succeed again
    send(db, mark(held, KEY, REPLACER))
    send(db, hand_over(held, KEY, HOLDER))
    assert send(db, withdraw(held, KEY, REPLACER, RELEASED_MARK)) is True
    assert value(db, held) == (f"{REPLACER} (handed over){RELEASED_MARK}", False)


def test_an_expired_row_is_neither_marked_nor_handed_over(
    db: psycopg.Connection[Any], held: tuple[str, str]
) -> None:
    send(db, mark(held, KEY, REPLACER))
    db.execute(
        sql.SQL("UPDATE {} SET expire_at = NOW() WHERE key = %s").format(sql.Identifier(*held)),
        (KEY,),
    )
    assert send(db, hand_over(held, KEY, HOLDER)) is None
    assert send(db, mark(held, KEY, THIRD)) is None
