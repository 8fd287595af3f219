# GENERATED from dislock-aio's dislock/aio/_fencing.py by tools/async_to_sync.py: do not edit.
# Change the asyncio source, then run `hatch run generate`.
"""Giving a transaction the fencing token that a guarded table asks for
(``dislockctl fence``; the statement is ``dislock.core.fencing``'s)."""

from __future__ import annotations

from typing import Any

from psycopg import Connection
from psycopg.pq import TransactionStatus

from dislock.core.errors import ConfigurationError
from dislock.core.fencing import set_token


def set_fencing_token(
    conn: Connection[Any], token: int | str | None, *, session: bool = False
) -> None:
    """Let ``conn``'s current transaction carry fencing ``token`` (a lock's ``fence``,
    a session's ``fencing_token``) to the tables ``dislockctl fence`` guards; with
    ``session``, every later transaction on the connection too.

    Behind PgBouncer in transaction mode, call it first in each transaction, without
    ``session``: a session's setting would stay with the server connection, which
    serves other clients next.  Raises ``ConfigurationError`` for a token that is not
    a whole number (None: a lock taken without fencing), and where no transaction is
    open (an autocommit connection outside ``conn.transaction()``), since the setting
    would end with the call.
    """
    exchange = set_token(token, local=not session)
    idle = conn.info.transaction_status == TransactionStatus.IDLE
    if not session and idle and conn.autocommit:
        raise ConfigurationError(
            "set_fencing_token: no transaction is open on this autocommit connection; "
            "call it inside conn.transaction(), or pass session=True"
        )
    conn.execute(exchange.query, exchange.params)
