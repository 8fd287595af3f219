"""Replacing a lease's running holder (``LockContext.replace``, ``LOCK_REPLACE=1``):
the marks in the lease row, the statements that write and read them, and their
answers (docs/cli.md, "Replacing the running copy").

The newest run wins, and never overlaps the one it replaces.  The hand-over goes
through the lease row's ``value`` alone:

1. The replacer, refused by a live row, *marks* it (``holder (replaced by S)``, ``S``
   its ``successor`` text), leaving ``expire_at`` alone: the row stays live for all.
2. The holder's next renewal, guarded by ``value``, finds the row gone: the lease is
   lost, its command's group stopped (by the guard at the deadline if need be), and
   the holder reads why (``replaced_by``).  Once the group is gone it *hands over*:
   ``value`` becomes ``S``, live until the same ``expire_at``.
3. The replacer, polling, *takes over* the row that is its ``S`` (``take_over`` in
   ``dislock.core.lock_queries``), or once it expired takes it as any expired row.

A dead or frozen holder never hands over; its row expires when its last renewal
said, its command stopped by then (the guard).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

from psycopg import sql

from dislock.core.answers import read_released
from dislock.core.exchange import Exchange, Rows, select_list

REPLACED_MARK = " (replaced by "
"""Follows the holder's owner token in a lease row a replacer marked; the
successor text and ``)`` follow it."""

HANDED_MARK = " (handed over)"
"""Follows the successor text in a row a replaced holder handed over."""

POLL_SECONDS = 0.2
"""How often a replacer tries to take the row over while it waits for it."""

SLACK_SECONDS = 1.0
"""How long past the marked row's expiry a replacer keeps trying: the expiry is
measured on the server's clock, the wait on ours."""


def successor(owner: str, host: str) -> str:
    """What a replacer writes into the mark, and the holder hands the row over to:
    its owner token, which names its host already unless the owner was chosen."""
    return owner if owner.startswith(f"{host}:") else f"{owner} on {host}"


class Marked(NamedTuple):
    """A live holder's row, marked: whose it was, and how long it may stay live (the
    row ``mark`` answers)."""

    holder: str
    remaining: float
    """Seconds until the row expires (the server's clock), at the mark."""


def _via(table_parts: tuple[str, ...], name: str, plain: Exchange[Any]) -> Exchange[Any]:
    """``plain`` as a call to the lock function ``name`` (``dislock.core.wrapped``)."""
    from dislock.core import protocol

    call = protocol.call(table_parts, name, tuple(plain.params))
    return protocol.via_function(table_parts, plain._replace(query=call), plain)


@lru_cache(maxsize=32)
def mark_query(table_parts: tuple[str, ...]) -> sql.Composed:
    """Mark the live lease row ``key`` for ``successor``, unless a replacer marked it
    already or it is being handed over (the first replacer waits its turn; a later
    one is refused as by a held lease)."""
    return sql.SQL(
        "UPDATE {table} SET value = value || %(mark)s"
        " WHERE key = %(key)s AND expire_at > NOW() AND strpos(value, %(marked)s) = 0"
        " AND strpos(value, %(handed)s) = 0"
        " RETURNING {columns}"
    ).format(
        table=sql.Identifier(*table_parts),
        columns=select_list(
            Marked._fields,
            holder=sql.SQL("left(value, -length(%(mark)s))"),
            remaining=sql.SQL("extract(epoch FROM expire_at - NOW())::float8"),
        ),
    )


def mark(table_parts: tuple[str, ...], key: str, successor: str) -> Exchange[Marked | None]:
    """Ask the live holder of the lease row ``key`` to hand it over to ``successor``:
    who held it and for how long yet, or None (free, or being replaced already)."""
    params = {
        "key": key,
        "mark": f"{REPLACED_MARK}{successor})",
        "marked": REPLACED_MARK,
        "handed": HANDED_MARK,
    }
    return _via(table_parts, "mark", Exchange(mark_query(table_parts), params, _read_marked))


def _read_marked(rows: Rows) -> Marked | None:
    if not rows:
        return None
    found = Marked._make(rows[0])
    return Marked(str(found.holder), max(0.0, float(found.remaining)))


@lru_cache(maxsize=32)
def hand_over_query(table_parts: tuple[str, ...]) -> sql.Composed:
    """The owner's marked live row ``key`` is handed over to its successor;
    ``expire_at`` stays.  (Lengths in characters, as the server counts them.)"""
    return sql.SQL(
        "UPDATE {table}"
        " SET value = substr(value, length(%(prefix)s) + 1,"
        " length(value) - length(%(prefix)s) - 1) || %(handed)s"
        " WHERE key = %(key)s AND starts_with(value, %(prefix)s) AND right(value, 1) = ')'"
        " AND expire_at > NOW()"
        " RETURNING left(value, -length(%(handed)s))"
    ).format(table=sql.Identifier(*table_parts))


def hand_over(table_parts: tuple[str, ...], key: str, owner: str) -> Exchange[str | None]:
    """Hand ``owner``'s marked lease row ``key`` to the replacer that marked it: the
    successor's text, or None (not marked for a successor, or expired)."""
    params = {"key": key, "prefix": f"{owner}{REPLACED_MARK}", "handed": HANDED_MARK}
    plain = Exchange(
        hand_over_query(table_parts), params, lambda rows: str(rows[0][0]) if rows else None
    )
    return _via(table_parts, "hand_over", plain)


def handed(successor: str) -> str:
    """The ``value`` of a row handed over to ``successor``."""
    return f"{successor}{HANDED_MARK}"


@lru_cache(maxsize=32)
def withdraw_query(table_parts: tuple[str, ...]) -> sql.Composed:
    """Undo a replacer's mark (the holder's renewals succeed again), or free the row
    handed over to it, whichever the live row ``key`` shows.  The mark names the
    replacer's own token, so no other replacer's row matches."""
    return sql.SQL(
        "UPDATE {table}"
        " SET value = CASE WHEN value = %(handed)s THEN value || %(released)s"
        " ELSE left(value, -length(%(mark)s)) END,"
        " expire_at = CASE WHEN value = %(handed)s THEN NOW() ELSE expire_at END"
        " WHERE key = %(key)s AND expire_at > NOW()"
        " AND (value = %(handed)s OR right(value, length(%(mark)s)) = %(mark)s)"
        " RETURNING 1"
    ).format(table=sql.Identifier(*table_parts))


def withdraw(
    table_parts: tuple[str, ...], key: str, successor: str, released: str
) -> Exchange[bool]:
    """A replacer's (``successor``'s) withdrawal from the lease row ``key`` it marked
    (``released``: the mark a release leaves): whether there was anything to undo."""
    params = {
        "key": key,
        "mark": f"{REPLACED_MARK}{successor})",
        "handed": handed(successor),
        "released": released,
    }
    return _via(
        table_parts, "withdraw", Exchange(withdraw_query(table_parts), params, read_released)
    )


class KeyValue(NamedTuple):
    """A lock row's key and value: the row ``values`` answers."""

    key: str
    value: str


@lru_cache(maxsize=32)
def values_query(table_parts: tuple[str, ...]) -> sql.Composed:
    """The ``KeyValue`` of the rows ``keys``."""
    columns = select_list(KeyValue._fields, key=sql.SQL("key"), value=sql.SQL("value"))
    return sql.SQL("SELECT {columns} FROM {table} WHERE key = ANY(%(keys)s::text[])").format(
        columns=columns, table=sql.Identifier(*table_parts)
    )


def values(table_parts: tuple[str, ...], keys: list[str]) -> Exchange[dict[str, str]]:
    """The value of each row among ``keys`` that exists: why renewals found them gone."""
    return Exchange(values_query(table_parts), {"keys": keys}, _read_values)


def _read_values(rows: Rows) -> dict[str, str]:
    return {str(row.key): str(row.value) for row in map(KeyValue._make, rows)}


def replaced_by(owner: str, value: str | None) -> str | None:
    """The successor ``owner``'s row ``value`` was marked for, or None."""
    prefix = f"{owner}{REPLACED_MARK}"
    if value is None or not value.startswith(prefix) or not value.endswith(")"):
        return None
    return value[len(prefix) : -1]
