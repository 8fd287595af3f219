# GENERATED from dislock-aio's dislock/aio/_listen.py by tools/async_to_sync.py: do not edit.
# Change the asyncio source, then run `hatch run generate`.
"""The connection a waiting lease listens on for releases (``LISTEN``/``NOTIFY``).

Hand-written in ``dislock/aio/_listen.py``; ``dislock/_sync/_listen.py`` is
generated from it by ``tools/async_to_sync.py``.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from psycopg import Connection
from psycopg.rows import TupleRow
from psycopg.sql import SQL, Identifier

from dislock.core.exchange import Exchange
from dislock.core.waiting import ListenRow


class Listener:
    """A direct connection of its own that ``LISTEN``s for released leases.

    Only a direct connection hears a ``NOTIFY``: behind a pooler in transaction
    mode the ``LISTEN`` lands on whichever server connection ran it, and that one
    is soon serving someone else.  A pooler shows itself by answering the startup
    with a backend process id of its own making, which ``open`` compares with the
    one the server reports.  The payload it waits for is the server's own making
    too (``dislock.core.waiting.listen``), so that it is the one a release sends,
    whatever names the table.
    """

    def __init__(self, conn: Connection[TupleRow], wake: str) -> None:
        self.conn = conn
        self.wake = wake

    @classmethod
    def open(
        cls,
        url: str,
        kwargs: dict[str, Any],
        channel: str,
        exchange: Exchange[ListenRow],
        *,
        detect: bool,
    ) -> Listener | None:
        """A listening connection; None when ``detect`` finds a pooler in between.
        ``exchange`` (``dislock.core.waiting.listen``) answers the backend pid and
        the payload."""
        conn = Connection.connect(url, **kwargs)
        try:
            cursor = conn.execute(exchange.query, exchange.params)
            found = exchange.read(cursor.fetchall())
            if detect and found.backend_pid != conn.info.backend_pid:
                conn.close()
                return None
            wake = found.wake
            conn.execute(SQL("LISTEN {}").format(Identifier(channel)))
        except BaseException:
            conn.close()
            raise
        return cls(conn, wake)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for a release of our lease; whether one came.  The
        notifications already received with it are dropped (``drain``): one
        wake-up stands for them all."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            notifies = self.conn.notifies(timeout=left)
            try:
                for notify in notifies:
                    if notify.payload == self.wake:
                        break
                else:
                    continue
            finally:
                # Closed now: it holds the connection until it ends.
                notifies.close()
            self.drain()
            return True

    def drain(self) -> None:
        """Drop the notifications received so far, without waiting for more."""
        for _ in self.conn.notifies(timeout=0):
            pass

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()
