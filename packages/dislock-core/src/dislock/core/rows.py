"""The lock table's rows as every dislock version reads them: their keys, and the
marks a release leaves in ``value``.

The keys are shared with dislock 0.1.0 on one table and never change
(``dislock.core.kinds`` names the kinds); a pause row sits beside them.
"""

from __future__ import annotations

from psycopg import sql

from dislock.core.kinds import KEY_PREFIX, LEASE, SCHEDULE, kind


def schedule_key(lock_key: str) -> str:
    return kind(SCHEDULE).row_key(lock_key)


def lease_key(lock_key: str) -> str:
    return kind(LEASE).row_key(lock_key)


def pause_key(lock_key: str) -> str:
    """The row that pauses ``lock_key`` fleet-wide (``dislock.core.pause``)."""
    return f"{PAUSE_PREFIX}{lock_key}"


PAUSE_PREFIX = f"{KEY_PREFIX}:pause:"


def lock_key_of_pause(pause: sql.Composable) -> sql.Composed:
    """A scalar SQL expression: the lock key of the pause row key ``pause`` (an
    expression): what the acquiring statements match a role's scope against."""
    return sql.SQL("substr({}, {})").format(pause, sql.Literal(len(PAUSE_PREFIX) + 1))


def pause_key_of(row_key: str) -> str:
    """The pause row of a schedule or lease row's key."""
    prefix, _, rest = row_key.partition(":")
    _, _, lock_key = rest.partition(":")
    return pause_key(lock_key) if prefix == KEY_PREFIX else f"{KEY_PREFIX}:pause:{row_key}"


RELEASED_MARK = " (released)"
"""Appended to ``value`` by a clean release, in the same update that ends the row: a
released row and one whose holder stopped renewing both have ``expire_at`` in the past,
and only this tells them apart.  The three columns stay as 0.1.0 made them, and
``expire_at`` keeps the moment of the release (``'-infinity'`` would have marked it too,
but psycopg, 0.1.0's tools included, cannot load it into a datetime)."""

FORCED_MARK = " (released by dislockctl)"
"""Appended by ``dislockctl release`` instead of ``RELEASED_MARK`` before it named who
released (``FORCED_BY``); still read."""

FORCED_BY = " (released by dislockctl as "
"""Starts the mark ``dislockctl release`` appends: `` (released by dislockctl as ROLE on
HOST)``, the database role that released it and the host it ran on."""


def forced_mark_of(value: str) -> tuple[str, str] | None:
    """The owner and who released it (``ROLE on HOST``; empty for a ``FORCED_MARK``) of
    a row ``value`` that ``dislockctl release`` marked; None for any other value."""
    if value.endswith(FORCED_MARK):
        return value.removesuffix(FORCED_MARK), ""
    owner, found, by = value.rpartition(FORCED_BY)
    return (owner, by[:-1]) if found and by.endswith(")") else None
