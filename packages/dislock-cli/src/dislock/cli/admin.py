"""What ``dislockctl`` shows to people of the lock rows (read by
``dislock.cli.lock_rows``), and the statements that create the lock table.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import NamedTuple

from psycopg import sql

from dislock.cli.lock_rows import PAUSE, LockRow
from dislock.core import kinds
from dislock.core.answers import read_clock
from dislock.core.bounds import MAX_REASON_BYTES, clip, escape
from dislock.core.exchange import Exchange, Rows, select_list
from dislock.core.table import create_table

MODES = kinds.NAMES


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


def no_row_text(
    lock_key: str, modes: Sequence[str], table: tuple[str, ...], *, hidden_from: str | None = None
) -> str:
    """Why ``release`` released nothing: no row of ``lock_key``'s ``modes`` (a typo is not
    a success), or none that the role ``hidden_from`` may see (row-level security)."""
    rows = f"no {' or '.join(modes)} lock row for {lock_key!r}"
    where = ".".join(table)
    if hidden_from is None:
        return f"{rows} in {where} (see dislockctl ls)"
    return (
        f"{rows} that role {escape(hidden_from)!r} may see in {where}: the row may exist, but"
        " no grant of that role covers the key (row-level security;"
        " dislockctl URL_VARIABLE grants lists the grants)"
    )


def describe_expiry(seconds: float) -> str:
    if math.isinf(seconds):  # written by hand: the lock functions never store one
        return "never (infinity)" if seconds > 0 else "expired (-infinity)"
    if seconds > 0:
        return f"in {format_duration(seconds)}"
    return f"expired {format_duration(-seconds)} ago"


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):  # between hand-written infinite times
        return "unknown" if math.isnan(seconds) else "infinity"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"


_REOPENED = re.compile(r" \(failed; retry in slot \d{1,11}\)$")
"""The mark a failed attempt leaves after the owner (``dislock.core.retries``)."""


def shown_owner(owner: str, expire_at: datetime, seconds_left: float) -> str:
    """``owner`` clipped, with a reopened slot's mark told as the time its retry may start
    (the row's expiry) and how far off it is."""
    mark = _REOPENED.search(owner)
    if mark is None:
        return clip(owner)
    when = f"{expire_at:%Y-%m-%d %H:%M:%S %Z}".rstrip()
    off = f"in {format_duration(seconds_left)}" if seconds_left > 0 else "due"
    return f"{clip(owner[: mark.start()])} (failed; retry from {when}, {off})"


def render_table(rows: Sequence[LockRow], waiting: Collection[str] = ()) -> str:
    """Rows as aligned columns, each with its state (a held one's ``LockRow.activity``, of
    ``waiting``); an N-holder lease's slots together under one line saying how many are
    held.  Keys and owners are escaped and clipped: rows written by other versions or by
    hand may hold control characters, or megabytes."""
    from dislock.core.pause import describe_until

    headers = ("LOCK KEY", "MODE", "OWNER", "EXPIRES", "FENCE", "STATE")
    lines: list[tuple[str, ...]] = []
    for group in _grouped(rows):
        first = group[0]
        alone = len(group) == 1 and first.slot == 1
        if not alone:
            held = sum(row.held for row in group)
            lines.append(
                (clip(first.lock_key), first.mode, "", "", "", f"{held}/{len(group)} held")
            )
        for row in group:
            left, paused = row.expires_in_seconds, row.mode == PAUSE
            cells = (
                clip(row.lock_key) if alone else f"  slot {row.slot}",
                row.mode,
                "-" if paused else shown_owner(row.owner, row.expire_at, left),
                describe_until(row.expire_at) if paused else describe_expiry(left),
                "-" if row.fence is None else str(row.fence),
                _describe_state(row, waiting),
            )
            lines.append(cells)
    return aligned([headers, *lines])


def aligned(rows: Sequence[Sequence[str]]) -> str:
    """Rows of cells (the first: the headers) as columns, two spaces apart."""
    widths = [max(len(cells[i]) for cells in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        for cells in rows
    )


def _describe_state(row: LockRow, waiting: Collection[str]) -> str:
    if row.mode == PAUSE:
        # The last column: a reason as long as pause accepts is shown whole.
        return f"paused: {clip(row.owner, MAX_REASON_BYTES)}" if row.owner else "paused"
    if row.released_by is not None:
        return f"released (by dislockctl{released_as(row.released_by)})"
    if (gone := row.holder_gone) is not None:
        return f"held (its process {gone} is not running on this host: expires with its TTL)"
    return row.activity(waiting) or row.state


def _grouped(rows: Sequence[LockRow]) -> list[list[LockRow]]:
    """Rows by (lock key, mode) in the order first seen, each group's slots in order."""
    groups: dict[tuple[str, str], list[LockRow]] = {}
    for row in rows:
        groups.setdefault((row.lock_key, row.mode), []).append(row)
    return [sorted(group, key=lambda row: row.slot) for group in groups.values()]


def released_as(by: str) -> str:
    """`` as ROLE on HOST``, clipped and escaped, of a forced release that named them."""
    return f" as {clip(by)}" if by else ""


def render_json(rows: Sequence[LockRow], waiting: Collection[str] = ()) -> str:
    listed = [{**row.as_json(), "activity": row.activity(waiting)} for row in rows]
    return json.dumps(listed, indent=2)


class Writability(NamedTuple):
    """The row ``refusing_writes`` answers."""

    in_recovery: bool
    read_only: bool


def _read_writable(rows: Rows) -> str | None:
    (found,) = map(Writability._make, rows)
    return read_only_reason(in_recovery=bool(found.in_recovery), read_only=bool(found.read_only))


def refusing_writes() -> Exchange[str | None]:
    """Why this session cannot take locks (a standby, or a read-only session), or None."""
    columns = select_list(
        Writability._fields,
        in_recovery=sql.SQL("pg_is_in_recovery()"),
        read_only=sql.SQL("current_setting('transaction_read_only') = 'on'"),
    )
    return Exchange(sql.SQL("SELECT {}").format(columns), {}, _read_writable)


DATABASE_NOW: Exchange[datetime] = Exchange(sql.SQL("SELECT NOW() AS now"), {}, read_clock)
"""The database clock (its transaction's start)."""


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
