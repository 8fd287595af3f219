"""One statement ready to send: its text, its parameters, and how its answer reads.

The sans-I/O side owns the whole exchange (as h11 owns an HTTP exchange): the
lock code sends ``query`` with ``params`` and feeds every row of the answer to
``read``, which returns a typed answer or raises the error the answer means.
So a statement's columns are known in one place, next to its text, and its
answer can be tested without a database.  A connection renders each statement to
bytes once (``Rendered``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

from psycopg import sql

if TYPE_CHECKING:
    from psycopg.abc import AdaptContext

Answer = TypeVar("Answer")

Rows = Sequence[Sequence[Any]]


def select_list(fields: Sequence[str], **expressions: sql.Composable) -> sql.Composed:
    """A ``SELECT`` list naming each column: ``expression AS field``, in the order of
    ``fields`` (a reader's row type's ``_fields``), so that a statement's columns are
    named once, by the type its reader reads the row into, and cannot drift from it."""
    if set(expressions) != set(fields):
        raise ValueError(f"columns {sorted(expressions)} do not match the row's {list(fields)}")
    return sql.SQL(", ").join(
        sql.SQL("{} AS {}").format(expressions[field], sql.Identifier(field)) for field in fields
    )


class Exchange(NamedTuple, Generic[Answer]):
    query: sql.SQL | sql.Composed
    """Built once per table, so that connections can keep its rendering (``Rendered``)."""
    params: dict[str, Any]
    read: Callable[[Rows], Answer]
    """The answer of the statement's rows (all of them, possibly none)."""
    fallback: Exchange[Answer] | None = None
    """For a call to a function of dislock's (``dislock.core.protocol``): the plain
    statement to send instead when the server has no such function (SQLSTATE 42883)."""
    functions_of: tuple[str, ...] | None = None
    """The table whose functions it calls (``protocol.MISSING`` learns of it then)."""


def read_flag(rows: Rows) -> bool:
    """The answer of a statement of one boolean column: whether a row says true (no
    row: false)."""
    return any(bool(flag) for (flag,) in rows)


def read_value(rows: Rows) -> Any:
    """The answer of a statement of one column: the first row's value (no row: None)."""
    return next((value for (value,) in rows), None)


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
