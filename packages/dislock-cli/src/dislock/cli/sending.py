"""Sending a core exchange (``dislock.core.exchange``) on one of ``dislockctl``'s plain
psycopg connections, its reader fed the rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import psycopg

    # Types only: core.exchange loads psycopg, which a command imports when it runs.
    from dislock.core.exchange import Answer, Exchange

    Connection: TypeAlias = psycopg.Connection[Any]


def send(conn: Connection, exchange: Exchange[Answer]) -> Answer:
    """``exchange``'s answer; a call to a lock function the table lacks is sent again as its
    plain statement (outside a transaction, where the failed call aborted nothing)."""
    from psycopg.errors import UndefinedFunction

    try:
        cursor = conn.execute(exchange.query, exchange.params)
    except UndefinedFunction:
        if exchange.fallback is None or not conn.autocommit:
            raise
        from dislock.core.protocol import missing

        return send(conn, missing(exchange))
    return exchange.read(cursor.fetchall() if cursor.description is not None else [])
