"""Sending a core exchange (``dislock.core.exchange``) on one of ``dislockctl``'s
plain psycopg connections: the statement, its parameters, and its reader fed the
rows, so that no command reads a column by position."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from dislock.core.exchange import Answer, Exchange

if TYPE_CHECKING:
    import psycopg

    Connection: TypeAlias = psycopg.Connection[Any]
    """A connection of ``dislockctl``'s: plain psycopg, rows as tuples."""


def send(conn: Connection, exchange: Exchange[Answer]) -> Answer:
    """``exchange``'s answer, read from the rows ``conn`` returned for it."""
    cursor = conn.execute(exchange.query, exchange.params)
    return exchange.read(cursor.fetchall() if cursor.description is not None else [])
