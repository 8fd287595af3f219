"""The connection a waiting lease listens on for releases (``LISTEN``/``NOTIFY``).

Hand-written in ``dislock/aio/_listen.py``; ``dislock/_sync/_listen.py`` is
generated from it by ``tools/async_to_sync.py``.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg.sql import SQL, Identifier


class Listener:
    """A direct connection of its own that ``LISTEN``s for released leases.

    Only a direct connection hears a ``NOTIFY``: behind a pooler in transaction
    mode the ``LISTEN`` lands on whichever server connection ran it, and that one
    is soon serving someone else.  A pooler shows itself by answering the startup
    with a backend process id of its own making, which ``open`` compares with the
    one the server reports.
    """

    def __init__(self, conn: AsyncConnection[TupleRow], wake: str) -> None:
        self.conn = conn
        self.wake = wake

    @classmethod
    async def open(
        cls, url: str, kwargs: dict[str, Any], channel: str, wake: str, *, detect: bool
    ) -> Listener | None:
        """A listening connection; None when ``detect`` finds a pooler in between."""
        conn = await AsyncConnection.connect(url, **kwargs)
        try:
            if detect:
                cursor = await conn.execute("SELECT pg_backend_pid()")
                row = await cursor.fetchone()
                if row is None or row[0] != conn.info.backend_pid:
                    await conn.close()
                    return None
            await conn.execute(SQL("LISTEN {}").format(Identifier(channel)))
        except BaseException:
            await conn.close()
            raise
        return cls(conn, wake)

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for a release of our lease; whether one came."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            async for notify in self.conn.notifies(timeout=left):
                if notify.payload == self.wake:
                    return True

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.conn.close()
