"""Sending a core exchange (``dislock.core.exchange``) on a plain psycopg connection,
as the lock code's hub does, for tests that run one lock statement by hand."""

from __future__ import annotations

from typing import Any

import psycopg

from dislock.core.exchange import Answer, Exchange


def send(conn: psycopg.Connection[Any], exchange: Exchange[Answer]) -> Answer:
    cursor = conn.execute(exchange.query, exchange.params)
    return exchange.read(cursor.fetchall() if cursor.description is not None else [])
