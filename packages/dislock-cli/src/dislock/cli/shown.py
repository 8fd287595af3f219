"""How much ``dislockctl`` reads of the texts in the tables, which anyone may have written.

A granted role writes no text longer than ``dislock.core.bounds.MAX_STORED_BYTES``,
but the table's owner may, and so may a role before its grant (or 0.1.0 under
the owner's role): one 50 MB ``value`` once made ``ls`` print a gigabyte.  So each
statement of ``ls``, ``history``, ``missed``, ``check``, ``release`` and ``serve``
reads at most ``READ`` characters of a text column (``read``: the server cuts it,
and never sends the rest), which keeps every text the bounds admit whole and tells
a longer one by its length (``cut``).  What a person sees is shorter still
(``dislock.core.bounds.clip``); ``--json`` keeps ``MAX_STORED_BYTES`` characters
and says ``"truncated": true`` of a row that had more.
"""

from __future__ import annotations

from psycopg import sql

from dislock.core.bounds import MAX_STORED_BYTES
from dislock.core.history import OUTCOMES

READ = MAX_STORED_BYTES + 1
"""Characters read of a text: one more than any text the bounds admit can have
(a character is at least one byte), so that a longer one is known to be cut."""

OTHER_OUTCOME = "other"
"""A recorded outcome that is none of ``dislock.core.history.OUTCOMES`` (written by
hand, or by a role before its grant), as ``dislock_runs_total`` labels it."""


def read(column: str | sql.Composable) -> sql.Composed:
    """``column`` (a name, or an expression) as far as the statement reads it.
    ``substr`` rather than ``left``: it decompresses a stored text only as far as
    needed."""
    expression = sql.Identifier(column) if isinstance(column, str) else column
    return sql.SQL("substr({}, 1, {})").format(expression, sql.Literal(READ))


def known_outcome(column: sql.Composable) -> sql.Composed:
    """A recorded outcome as ``serve`` counts it: dislock's own, NULL (not ended), or
    ``OTHER_OUTCOME``."""
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
