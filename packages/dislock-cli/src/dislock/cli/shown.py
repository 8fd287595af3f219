"""How much ``dislockctl`` reads of the texts in the tables, which anyone may have written.

A granted role writes no text longer than ``dislock.core.bounds.MAX_STORED_BYTES``,
but the table's owner may (one 50 MB ``value`` once made ``ls`` print a gigabyte).
So every statement reads at most ``READ`` characters of a text column (``read``: the
server never sends the rest), which keeps every text the bounds admit whole and tells
a longer one by its length (``cut``, ``was_cut``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from psycopg import sql

from dislock.core.bounds import MAX_STORED_BYTES
from dislock.core.history import OUTCOMES

if TYPE_CHECKING:
    from dislock.core.exchange import Rows

Row = TypeVar("Row", bound=NamedTuple)

READ = MAX_STORED_BYTES + 1
"""One more than any text the bounds admit (a character is at least one byte)."""

OTHER_OUTCOME = "other"
"""A recorded outcome that is none of ``dislock.core.history.OUTCOMES``, as counted."""


def read(column: str | sql.Composable) -> sql.Composed:
    """``column`` (a name, or an expression) as far as the statement reads it; ``substr``
    decompresses a stored text only as far as needed."""
    expression = sql.Identifier(column) if isinstance(column, str) else column
    return sql.SQL("substr({}, 1, {})").format(expression, sql.Literal(READ))


def known_outcome(column: sql.Composable) -> sql.Composed:
    """A recorded outcome as ``serve`` counts it (NULL: not ended)."""
    return sql.SQL("CASE WHEN {c} IS NULL OR {c} IN ({known}) THEN {c} ELSE {other} END").format(
        c=column,
        known=sql.SQL(", ").join(map(sql.Literal, OUTCOMES)),
        other=sql.Literal(OTHER_OUTCOME),
    )


def cut(text: str) -> str:
    """A text as read, to the most that the bounds admit."""
    return text[:MAX_STORED_BYTES]


def was_cut(text: str | None) -> bool:
    """Whether a text as read is longer than any the bounds admit: it was cut."""
    return text is not None and len(text) > MAX_STORED_BYTES


def rows_of(row_type: type[Row], *texts: str) -> Callable[[Rows], list[Row]]:
    """The reader of a statement's rows into ``row_type`` (its ``select_list``), the
    fields ``texts`` ``cut`` where not None."""

    def read_rows(rows: Rows) -> list[Row]:
        found = [row_type._make(row) for row in rows]
        return [row._replace(**_cut(row, texts)) if texts else row for row in found]

    return read_rows


def _cut(row: Any, texts: tuple[str, ...]) -> dict[str, str]:
    return {name: cut(getattr(row, name)) for name in texts if getattr(row, name) is not None}
