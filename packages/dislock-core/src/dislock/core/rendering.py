"""Statements rendered to bytes once per connection, for the shells' connection wrappers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from psycopg import sql

if TYPE_CHECKING:
    from psycopg.abc import AdaptContext


class Rendered:
    """The statements one connection has run, rendered to bytes for it once (not
    quoted anew on every renewal); the rendering depends on the connection's
    encoding, hence one of these per connection."""

    LIMIT = 256
    """Statements kept (a few per lock table in use); past it, the cache starts over."""

    def __init__(self, context: AdaptContext | None) -> None:
        self._context = context
        self._by_id: dict[int, tuple[sql.Composable, bytes]] = {}

    def __call__(self, query: sql.Composable) -> bytes:
        found = self._by_id.get(id(query))
        if found is None or found[0] is not query:  # an id reused by another object
            if len(self._by_id) >= self.LIMIT:
                self._by_id.clear()
            found = self._by_id[id(query)] = (query, query.as_bytes(self._context))
        return found[1]
