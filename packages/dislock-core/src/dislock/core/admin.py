"""What the operator tool (``dislockctl``) says to the database and shows to people.

SQL for creating the table, listing and force-releasing locks, and the
formatting of what comes back; ``dislock.cli.ctl`` only runs it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from psycopg import sql

from dislock.core.sql import KEY_PREFIX, create_table, lease_key, schedule_key

MODES = ("schedule", "lease")


def init_statements(table_parts: tuple[str, ...], *, fencing: bool) -> list[sql.Composed]:
    """Idempotent DDL for the lock table (and its schema, and the fencing column)."""
    statements: list[sql.Composed] = []
    if len(table_parts) == 2:
        statements.append(
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(table_parts[0]))
        )
    statements.append(create_table(table_parts, fencing=fencing))
    if fencing:
        # For a table created earlier without it; existing rows start at 0.
        statements.append(
            sql.SQL(
                "ALTER TABLE {} ADD COLUMN IF NOT EXISTS fence bigint NOT NULL DEFAULT 0"
            ).format(sql.Identifier(*table_parts))
        )
    return statements


def columns_query(table_parts: tuple[str, ...]) -> tuple[str, tuple[str]]:
    """The lock table's column names, from the catalog (no rights on the table
    needed); no rows if the table does not exist."""
    return (
        "SELECT attname FROM pg_attribute"
        " WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped"
        " ORDER BY attnum",
        (sql.Identifier(*table_parts).as_string(None),),
    )


def list_query(table_parts: tuple[str, ...]) -> sql.Composed:
    """Every lock row whose lock key starts with %(prefix)s, on the database clock.

    ``fence`` is read through ``to_jsonb`` so that one query serves tables with
    and without the fencing column.
    """
    return sql.SQL(
        "SELECT key, value, expire_at,"
        " EXTRACT(EPOCH FROM (expire_at - NOW()))::float8,"
        " (to_jsonb(held) ->> 'fence')::bigint"
        " FROM {table} AS held"
        " WHERE starts_with(key, %(schedule_prefix)s) OR starts_with(key, %(lease_prefix)s)"
        " ORDER BY key"
    ).format(table=sql.Identifier(*table_parts))


def state_query(table_parts: tuple[str, ...]) -> sql.Composed:
    """Owner and seconds left of the rows among %(keys)s."""
    return sql.SQL(
        "SELECT key, value, EXTRACT(EPOCH FROM (expire_at - NOW()))::float8"
        " FROM {table} WHERE key = ANY(%(keys)s)"
    ).format(table=sql.Identifier(*table_parts))


def list_params(prefix: str) -> dict[str, Any]:
    return {"schedule_prefix": schedule_key(prefix), "lease_prefix": lease_key(prefix)}


def release_query(table_parts: tuple[str, ...], *, owner_guard: bool) -> sql.Composed:
    """Force-expire held rows among %(keys)s (optionally only if %(owner)s holds them),
    returning what was released and how long it had left."""
    guard = sql.SQL(" AND value = %(owner)s") if owner_guard else sql.SQL("")
    return sql.SQL(
        "WITH target AS ("
        " SELECT key, expire_at FROM {table}"
        " WHERE key = ANY(%(keys)s) AND expire_at > NOW(){guard} FOR UPDATE)"
        " UPDATE {table} AS held SET expire_at = NOW() FROM target"
        " WHERE held.key = target.key"
        " RETURNING held.key, held.value,"
        " EXTRACT(EPOCH FROM (target.expire_at - NOW()))::float8"
    ).format(table=sql.Identifier(*table_parts), guard=guard)


def release_keys(lock_key: str, modes: Sequence[str]) -> list[str]:
    return [schedule_key(lock_key) if mode == "schedule" else lease_key(lock_key) for mode in modes]


@dataclass(frozen=True)
class LockRow:
    key: str
    mode: str
    lock_key: str
    owner: str
    expire_at: datetime
    expires_in_seconds: float
    fence: int | None

    @property
    def held(self) -> bool:
        return self.expires_in_seconds > 0

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> LockRow:
        key, owner, expire_at, expires_in, fence = row
        mode, lock_key = split_key(key)
        return cls(key, mode, lock_key, owner, expire_at, float(expires_in), fence)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["expire_at"] = self.expire_at.isoformat()
        data["held"] = self.held
        return data


def split_key(key: str) -> tuple[str, str]:
    """``cronjob-lock:<mode>:<lock_key>`` into its mode and lock key."""
    prefix, _, rest = key.partition(":")
    mode, _, lock_key = rest.partition(":")
    if prefix != KEY_PREFIX or mode not in MODES:
        return "?", key
    return mode, lock_key


def describe_expiry(seconds: float) -> str:
    if seconds > 0:
        return f"in {format_duration(seconds)}"
    return f"expired {format_duration(-seconds)} ago"


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"


def render_table(rows: Sequence[LockRow]) -> str:
    """Rows as aligned columns; expired rows are marked."""
    headers = ("LOCK KEY", "MODE", "OWNER", "EXPIRES", "FENCE", "STATE")
    lines = [
        (
            row.lock_key,
            row.mode,
            row.owner,
            describe_expiry(row.expires_in_seconds),
            "-" if row.fence is None else str(row.fence),
            "held" if row.held else "expired",
        )
        for row in rows
    ]
    widths = [max(len(cells[i]) for cells in (headers, *lines)) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        for cells in (headers, *lines)
    )


def render_json(rows: Sequence[LockRow]) -> str:
    return json.dumps([row.as_json() for row in rows], indent=2)


WRITABLE_QUERY = "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'"
"""Whether the server is a standby, and whether this session is read-only
(``default_transaction_read_only``, or a standby's)."""


def read_only_reason(*, in_recovery: bool, read_only: bool) -> str | None:
    """``dislockctl check``'s one line when the session cannot take locks, or None."""
    fix = (
        "point the URL at the primary, or list every host with"
        " ?target_session_attrs=read-write so that libpq picks the writable one"
    )
    if in_recovery:
        return f"the server is a standby (in recovery) and cannot take locks; {fix}"
    if read_only:
        return (
            "the session is read-only (default_transaction_read_only is on for this role or"
            f" database) and cannot take locks; turn it off for the lock role, or {fix}"
        )
    return None
