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

from dislock.core import kinds
from dislock.core.bounds import escape
from dislock.core.rows import FORCED_MARK, RELEASED_MARK, pause_key
from dislock.core.table import create_table
from dislock.core.waiting import wake_payload

MODES = kinds.NAMES

PAUSE = "pause"
"""The mode ``ls`` gives a pause row (``dislockctl pause``)."""

STATES = ("held", "released", "expired", "ended", "paused")
"""What ``ls`` says of a row: ``held`` (live), ``released`` (let go cleanly by its
holder, or by ``dislockctl release``), ``expired`` (a lease whose holder stopped
renewing: abandoned), ``ended`` (a schedule slot that is over, as slots end), and
``paused`` (a live ``dislockctl pause``)."""


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
    """Every lock row whose lock key starts with %(prefix)s, on the database clock:
    the rows of every kind (%(prefixes)s) and the extra slots of N-holder leases
    (their mode part matches %(slot_pattern)s).

    ``fence`` is read through ``to_jsonb`` so that one query serves tables with
    and without the fencing column.
    """
    return sql.SQL(
        "SELECT key, value, expire_at,"
        " EXTRACT(EPOCH FROM (expire_at - NOW()))::float8,"
        " (to_jsonb(held) ->> 'fence')::bigint"
        " FROM {table} AS held"
        " WHERE EXISTS (SELECT FROM unnest(%(prefixes)s::text[]) AS p (prefix)"
        " WHERE starts_with(key, p.prefix))"
        " OR (key ~ %(slot_pattern)s"
        " AND starts_with(regexp_replace(key, %(slot_pattern)s, ''), %(prefix)s))"
        # A pause that ran out is inert: not shown.
        " OR (starts_with(key, %(pause_prefix)s) AND expire_at > NOW())"
        " ORDER BY key"
    ).format(table=sql.Identifier(*table_parts))


def state_query(table_parts: tuple[str, ...]) -> sql.Composed:
    """Owner and seconds left of the rows among %(keys)s."""
    return sql.SQL(
        "SELECT key, value, EXTRACT(EPOCH FROM (expire_at - NOW()))::float8"
        " FROM {table} WHERE key = ANY(%(keys)s)"
    ).format(table=sql.Identifier(*table_parts))


def _slot_pattern(modes: Sequence[str]) -> str | None:
    """A regular expression matching the mode part of slot rows 2..N of ``modes``."""
    slotted = [kinds.kind(mode).mode for mode in modes if kinds.kind(mode).renewed]
    return f"^{kinds.KEY_PREFIX}:({'|'.join(slotted)})#[0-9]+:" if slotted else None


def list_params(prefix: str) -> dict[str, Any]:
    return {
        "prefixes": [kind.row_key(prefix) for kind in kinds.KINDS],
        "prefix": prefix,
        "slot_pattern": _slot_pattern(kinds.NAMES),
        "pause_prefix": pause_key(prefix),
    }


def release_query(table_parts: tuple[str, ...]) -> sql.Composed:
    """Force-expire held rows among %(keys)s, and with %(slot_pattern)s every slot row
    of %(lock_key)s (only those %(owner)s holds, unless it is NULL), returning what
    was released and how long it had left.  Waiters of the lease are woken (on
    %(channel)s, the payload of %(wake_key)s), as by a holder's own release."""
    return sql.SQL(
        "WITH target AS ("
        " SELECT key, value, expire_at FROM {table}"
        " WHERE (key = ANY(%(keys)s) OR (key ~ %(slot_pattern)s"
        " AND regexp_replace(key, %(slot_pattern)s, '') = %(lock_key)s))"
        " AND expire_at > NOW() AND (%(owner)s::text IS NULL OR value = %(owner)s::text)"
        " FOR UPDATE)"
        # Marked, so that ls tells a forced release from an abandoned lease.
        " UPDATE {table} AS held SET expire_at = NOW(), value = held.value || {mark} FROM target"
        " WHERE held.key = target.key"
        " RETURNING held.key, target.value,"
        " EXTRACT(EPOCH FROM (target.expire_at - NOW()))::float8,"
        " pg_notify(%(channel)s, {wake})"
    ).format(
        table=sql.Identifier(*table_parts),
        mark=sql.Literal(FORCED_MARK),
        wake=wake_payload(sql.SQL("held.tableoid")),
    )


def release_keys(lock_key: str, modes: Sequence[str]) -> list[str]:
    return [kinds.kind(mode).row_key(lock_key) for mode in modes]


def release_params(
    table_parts: tuple[str, ...],
    lock_key: str,
    modes: Sequence[str],
    *,
    slot: int | None = None,
    owner: str | None = None,
) -> dict[str, Any]:
    """Parameters of ``release_query``: the rows of ``modes``, every slot of a lease
    unless ``slot`` names one."""
    from dislock.core.waiting import WAKE_CHANNEL, wake_key

    if slot is None:
        keys, pattern = release_keys(lock_key, modes), _slot_pattern(modes)
    else:
        keys = [kinds.kind(mode).row_key(lock_key, slot) for mode in modes]
        pattern = None
    return {
        "keys": keys,
        "slot_pattern": pattern,
        "lock_key": lock_key,
        "owner": owner,
        "channel": WAKE_CHANNEL,
        "wake_key": wake_key(lock_key),
    }


@dataclass(frozen=True)
class LockRow:
    key: str
    mode: str
    """A kind's name (schedule, lease), or ``pause``."""
    lock_key: str
    owner: str
    """The holder's token, without a release mark; a pause's reason."""
    expire_at: datetime
    expires_in_seconds: float
    fence: int | None
    slot: int = 1
    """Which slot of an N-holder lease the row is (1 for every other row)."""
    value: str = ""
    """The ``value`` column as stored."""

    @property
    def held(self) -> bool:
        return self.expires_in_seconds > 0 and self.mode != PAUSE

    @property
    def forced(self) -> bool:
        """Released by ``dislockctl release`` rather than by its holder."""
        return not self.held and self.value.endswith(FORCED_MARK)

    @property
    def state(self) -> str:
        """One of ``STATES``."""
        if self.mode == PAUSE:
            return "paused"
        if self.expires_in_seconds > 0:
            return "held"
        if self.value.endswith((RELEASED_MARK, FORCED_MARK)):
            return "released"
        return "ended" if self.mode == kinds.SCHEDULE else "expired"

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> LockRow:
        key, value, expire_at, expires_in, fence = row
        found, lock_key, slot = kinds.parse_row_key(key)
        mode = "?" if found is None else found.name
        if found is None and key.startswith(pause_key("")):
            mode, lock_key = PAUSE, key.removeprefix(pause_key(""))
        owner = value
        if expires_in <= 0:
            owner = value.removesuffix(RELEASED_MARK).removesuffix(FORCED_MARK)
        return cls(key, mode, lock_key, owner, expire_at, float(expires_in), fence, slot, value)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["expire_at"] = self.expire_at.isoformat()
        data["held"] = self.held
        data["state"] = self.state
        data["forced"] = self.forced
        if self.mode == PAUSE:
            data["reason"] = data.pop("owner")
        return data


def released_text(mode: str) -> str:
    """What a forced release of a ``mode`` lock means, for the operator."""
    return kinds.kind(mode).released_text


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
    """Rows as aligned columns, each with its state (``STATES``).  The slots of an
    N-holder lease come together under one line saying how many are held (of the
    slots that have rows: a slot gets its row the first time it is taken)."""
    from dislock.core.pause import describe_until

    headers = ("LOCK KEY", "MODE", "OWNER", "EXPIRES", "FENCE", "STATE")
    lines: list[tuple[str, ...]] = []
    for group in _grouped(rows):
        first = group[0]
        if len(group) > 1 or first.slot > 1:
            held = sum(row.held for row in group)
            lines.append(
                (escape(first.lock_key), first.mode, "", "", "", f"{held}/{len(group)} held")
            )
        for row in group:
            lines.append(
                (
                    # Rows written by other versions or by hand may hold control characters.
                    escape(row.lock_key)
                    if len(group) == 1 and row.slot == 1
                    else f"  slot {row.slot}",
                    row.mode,
                    "-" if row.mode == PAUSE else escape(row.owner),
                    describe_until(row.expire_at)
                    if row.mode == PAUSE
                    else describe_expiry(row.expires_in_seconds),
                    "-" if row.fence is None else str(row.fence),
                    _describe_state(row),
                )
            )
    widths = [max(len(cells[i]) for cells in (headers, *lines)) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        for cells in (headers, *lines)
    )


def _describe_state(row: LockRow) -> str:
    if row.mode == PAUSE:
        return f"paused: {escape(row.owner)}" if row.owner else "paused"
    if row.forced:
        return "released (by dislockctl)"
    return row.state


def _grouped(rows: Sequence[LockRow]) -> list[list[LockRow]]:
    """Rows by (lock key, mode) in the order first seen, each group's slots in order."""
    groups: dict[tuple[str, str], list[LockRow]] = {}
    for row in rows:
        groups.setdefault((row.lock_key, row.mode), []).append(row)
    return [sorted(group, key=lambda row: row.slot) for group in groups.values()]


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
